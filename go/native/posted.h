// posted.h: what the library's Go side (posted.go) and its extension module
// (py_post.c) share about posted calls, in memory (posted.c): internal, not
// part of the C ABI.
#ifndef DC_POSTED_H
#define DC_POSTED_H

#include <stdint.h>

// dc_posted_over: whether the host may post a request's items.
enum {
    DC_POSTED_ALL_POST = 0, // every request's
    DC_POSTED_SOME = 1,     // every request's but those in dc_posted_full, which the host sends by the call
    DC_POSTED_BROKEN = 2,   // none, for good: the library no longer reads the socket
    DC_POSTED_ALL_CALL = 3, // none: more requests are full than dc_posted_full holds
};

// The slots of dc_posted_full: the handles of the requests at or over their
// send buffer's bound (0: an empty slot; no request's handle is 0).
enum { DC_POSTED_FULL_SLOTS = 64 };

// The most messages the host posts ahead of the library: with more posted
// and not yet run, it makes the call, which runs them first. So a request
// goes past its bound by at most this many messages' items before the host
// sees it listed, however far behind the library's thread falls (two CPUs
// that a busy loop keeps to itself).
enum { DC_POSTED_MAX_AHEAD = 4 };

extern uint64_t dc_posted_over;
extern uint64_t dc_posted_full[DC_POSTED_FULL_SLOTS];
extern uint64_t dc_posted_sent;
extern uint64_t dc_posted_done;

#endif
