/* error.c -- status strings, the per-thread last-error text and the library's version. */
#include <stdarg.h>
#include <stdio.h>

#include "backend.h"

/* Long enough for a message naming an argument, its value and the limit it broke. */
#define BL_ERROR_TEXT_BYTES 512

/* One buffer per thread: two threads calling into the library never see each other's errors. */
static _Thread_local char bl_error_text[BL_ERROR_TEXT_BYTES];

bl_status bl_set_error(bl_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(bl_error_text, sizeof bl_error_text, fmt, args);
    va_end(args);
    return status;
}

void bl_clear_error(void) { bl_error_text[0] = '\0'; }

const char *bl_last_error(void) { return bl_error_text; }

const char *bl_status_string(bl_status s) {
    switch (s) {
    case BL_OK: return "ok";
    case BL_ERR_INVALID_ARGUMENT: return "invalid argument";
    case BL_ERR_UNSUPPORTED: return "unsupported by this backend";
    case BL_ERR_NO_BACKEND: return "backend not available";
    case BL_ERR_WORKSPACE: return "workspace missing or too small";
    case BL_ERR_OUT_OF_MEMORY: return "out of host memory";
    case BL_ERR_CUDA: return "CUDA error";
    case BL_ERR_INTERNAL: return "internal error";
    case BL_ERR_NOT_DETERMINISTIC: return "no deterministic form";
    }
    return "unknown status";
}

#define BL_STRINGIFY_(x) #x
#define BL_STRINGIFY(x) BL_STRINGIFY_(x)

const char *bl_version_string(void) {
    return BL_STRINGIFY(BL_VERSION_MAJOR) "." BL_STRINGIFY(BL_VERSION_MINOR) "." BL_STRINGIFY(
        BL_VERSION_PATCH);
}

int bl_abi_version(void) { return BL_ABI_VERSION; }
