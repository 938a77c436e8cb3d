/* KVOFFLOAD_API marks what libkvoffload.so exports: the public C++ API (the classes and functions
 * declared in include/kvoffload) and the C API of kvoffload.h. The library is compiled with hidden
 * visibility, so everything else (core/src, the GPU backends, the kernels) stays internal and
 * cannot clash with an engine's own symbols. Plain C, so kvoffload.h can include it. */
#ifndef KVOFFLOAD_EXPORT_H
#define KVOFFLOAD_EXPORT_H

#if defined(__GNUC__)
#define KVOFFLOAD_API __attribute__((visibility("default")))
#else
#define KVOFFLOAD_API
#endif

#endif /* KVOFFLOAD_EXPORT_H */
