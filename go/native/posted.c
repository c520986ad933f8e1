// Posted calls (posted.go): what the host and the library share about them
// without calling each other (posted.h says what each is). The extension
// module (py_post.c) counts what it posts; Go counts what it ran, and
// writes which requests are full, which the module reads.
#include "posted.h"

_Alignas(8) uint64_t dc_posted_over;
_Alignas(8) uint64_t dc_posted_full[DC_POSTED_FULL_SLOTS];
_Alignas(8) uint64_t dc_posted_sent;
_Alignas(8) uint64_t dc_posted_done;
