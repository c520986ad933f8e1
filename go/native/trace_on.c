// The tracing flag: 1 while this process makes spans (go/tracing), 0
// otherwise. Go sets it (trace_exports.go) when a runtime turns tracing on
// or the last one turns it off; C reads it without calling into Go, so a
// host's span calls cost a load while tracing is off (py_trace.c).
#include <stdint.h>

uint32_t dc_trace_on;
