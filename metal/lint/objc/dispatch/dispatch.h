// libdispatch's semaphore, as Objective-C++ with ARC sees it (OS_OBJECT_USE_OBJC): a retainable
// object. For check_host.sh only (see ../Metal/Metal.h).
#pragma once

#include <Foundation/Foundation.h>
#include <stdint.h>

@protocol OS_dispatch_semaphore <NSObject>
@end
typedef NSObject<OS_dispatch_semaphore>* dispatch_semaphore_t;
typedef uint64_t dispatch_time_t;
#define DISPATCH_TIME_FOREVER (~0ull)
extern "C" dispatch_semaphore_t dispatch_semaphore_create(long value);
extern "C" long dispatch_semaphore_wait(dispatch_semaphore_t s, dispatch_time_t timeout);
extern "C" long dispatch_semaphore_signal(dispatch_semaphore_t s);
