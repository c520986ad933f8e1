// Posted calls (posted.go): what the host and the library share about them
// without calling each other: the extension module (py_post.c) and Go each
// write one of the counters; Go writes dc_posted_over, which the module
// reads.
#include <stdint.h>

// Nonzero while a request holds posted items at or over its send buffer's
// bound: the host then sends items by calling in (dc_request_send_multi),
// whose answers say which requests are full, until the library clears it.
_Alignas(8) uint64_t dc_posted_over;

// How many messages the host has posted (the host adds before it writes, and
// takes back what failed) and how many the library has run: equal when none
// waits, so that a call need not look at the socket.
_Alignas(8) uint64_t dc_posted_sent;
_Alignas(8) uint64_t dc_posted_done;
