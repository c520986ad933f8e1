// The last error message of each thread. Go sets it through dc_set_error on
// the same OS thread that called the exported function (a cgo callback stays
// on its thread), so the message a caller reads is the one of its own call.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DC_ENUMS_ONLY
#include "dynamo_ctx.h" // DC_ERROR_MESSAGE_MAX

static __thread char dc_errmsg[DC_ERROR_MESSAGE_MAX];
static __thread size_t dc_errlen;

void dc_set_error(const char* msg, size_t len) {
    if (len >= DC_ERROR_MESSAGE_MAX) len = DC_ERROR_MESSAGE_MAX - 1;
    if (len > 0) memcpy(dc_errmsg, msg, len);
    dc_errmsg[len] = 0;
    dc_errlen = len;
}

size_t dc_copy_error(char* buf, size_t cap) {
    if (buf != NULL && cap > 0) {
        size_t n = dc_errlen < cap - 1 ? dc_errlen : cap - 1;
        memcpy(buf, dc_errmsg, n);
        buf[n] = 0;
    }
    return dc_errlen;
}
