// The kill counter: how many contexts have been killed so far in this
// process. Go adds to it (ctxtree.CountKills, which context_exports.go points
// at it); C reads it without calling into Go. A reader that sees it unchanged
// since it found a stream not killed need not ask Go again (py_client.c's
// kill_epoch).
#include <stdint.h>

_Alignas(8) uint64_t dc_kill_epoch;
