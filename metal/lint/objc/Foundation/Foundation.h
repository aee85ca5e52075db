// Foundation as metal/lint/check_host.sh needs it (see ../Metal/Metal.h).
#pragma once

typedef signed char BOOL;
#define YES ((BOOL)1)
#define NO ((BOOL)0)
#define nil nullptr
typedef unsigned long NSUInteger;
typedef long NSInteger;
typedef struct {
    NSUInteger location, length;
} NSRange;
static inline NSRange NSMakeRange(NSUInteger loc, NSUInteger len) { return NSRange{loc, len}; }

@protocol NSObject
@end
__attribute__((objc_root_class)) @interface NSObject <NSObject> {
    Class isa;
}
+ (instancetype)new;
@end
@interface NSString : NSObject
+ (instancetype)stringWithUTF8String:(const char*)s;
@property(readonly) const char* UTF8String;
@end
@interface NSError : NSObject
@property(readonly, copy) NSString* localizedDescription;
@end
@interface NSURL : NSObject
+ (NSURL*)fileURLWithPath:(NSString*)path;
@end
