/* The one list of kvoffload's error codes, shared by C++ (kvoffload::ErrorCode and
 * to_string(ErrorCode), error.hpp), C (kvo_status and kvo_status_name, kvoffload.h) and Python
 * (kvoffload.ErrorCode). Each entry is X(value, NAME, CamelName, "name"):
 *   value      the stable number: the C API returns it, so never renumber or reuse one;
 *   NAME       the C enumerator KVO_NAME and the Python member ErrorCode.NAME;
 *   CamelName  the C++ enumerator ErrorCode::kCamelName;
 *   "name"     the stable lowercase name used in messages and JSON output.
 * A new code is added here, with the next value, and nowhere else (the tests in each language
 * list every code by hand, so they must be extended too). Plain C: kvoffload.h includes it. */
#ifndef KVOFFLOAD_ERROR_CODES_H
#define KVOFFLOAD_ERROR_CODES_H

/* clang-format off */
#define KVOFFLOAD_ERROR_CODES(X)                                                                  \
  X(0, OK, Ok, "ok")                                                                              \
  X(1, INVALID_ARGUMENT, InvalidArgument, "invalid_argument") /* bad input; nothing touched */   \
  X(2, CAPACITY, Capacity, "capacity")               /* not enough shared memory / space */      \
  X(3, SYSTEM, System, "system")                     /* a system call failed (errno is set) */   \
  X(4, TIMEOUT, Timeout, "timeout")                  /* waited too long for another process */   \
  X(5, MISMATCH, Mismatch, "mismatch")       /* an existing object disagrees with the caller */  \
  X(6, PERMISSION, Permission, "permission")         /* ownership or mode refused */             \
  X(7, NOT_AVAILABLE, NotAvailable, "not_available") /* backend/feature not built, or no device */ \
  X(8, DEVICE, Device, "device")                     /* the device runtime reported an error */  \
  X(9, TRANSFER_FAILED, TransferFailed, "transfer_failed") /* a copy job failed */               \
  X(10, NOT_FOUND, NotFound, "not_found")            /* a key, job or file that does not exist */ \
  X(11, STATE, State, "state")               /* not valid in the object's current state */       \
  X(12, INTERNAL, Internal, "internal")              /* a bug: an invariant did not hold */      \
  X(13, IN_USE, InUse, "in_use")       /* a rank slot or the scheduler role is held by a live PID */
/* clang-format on */

/* How many codes there are; they are numbered 0 .. KVOFFLOAD_ERROR_CODE_COUNT - 1. Each entry
 * expands to one "+1" term of the sum, so it cannot be parenthesised. */
#define KVOFFLOAD_ERROR_CODE_ONE_(value, upper, camel, name) \
  +1 /* NOLINT(bugprone-macro-parentheses) */
#define KVOFFLOAD_ERROR_CODE_COUNT (0 KVOFFLOAD_ERROR_CODES(KVOFFLOAD_ERROR_CODE_ONE_))

#endif /* KVOFFLOAD_ERROR_CODES_H */
