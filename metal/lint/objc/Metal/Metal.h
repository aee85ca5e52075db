// Declarations transcribed from Apple's Foundation and Metal headers (macOS 15 SDK), only what
// metal/device.mm and metal/runner.mm use, for check_host.sh: clang parses the Objective-C++ host
// on Linux against them. This catches C++ and Objective-C mistakes (types, ARC, the host's own
// C++ interfaces); whether these are the SDK's exact signatures is only settled by a Mac build
// (.github/workflows/macos-metal.yml).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <Foundation/Foundation.h>

typedef struct {
    NSUInteger width, height, depth;
} MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger w, NSUInteger h, NSUInteger d) { return MTLSize{w, h, d}; }

// NS_OPTIONS types are integer typedefs in C++ (so | combines them); NS_ENUM types are enums.
typedef NSUInteger MTLResourceOptions;
enum : NSUInteger { MTLResourceStorageModeShared = 0, MTLResourceStorageModePrivate = 32 };
typedef NSUInteger MTLPipelineOption;
enum : NSUInteger { MTLPipelineOptionNone = 0 };
typedef enum : NSUInteger { MTLDataTypeBool = 53, MTLDataTypeUInt = 33 } MTLDataType;
typedef enum : NSInteger { MTLGPUFamilyMetal3 = 5001 } MTLGPUFamily;
typedef enum : NSUInteger { MTLDispatchTypeSerial = 0, MTLDispatchTypeConcurrent = 1 } MTLDispatchType;
typedef NSUInteger MTLResourceUsage;
enum : NSUInteger { MTLResourceUsageRead = 1, MTLResourceUsageWrite = 2 };
typedef NSUInteger MTLIndirectCommandType;
enum : NSUInteger { MTLIndirectCommandTypeConcurrentDispatch = 32 };
typedef enum : NSUInteger { MTLCommandBufferStatusCompleted = 4, MTLCommandBufferStatusError = 5 } MTLCommandBufferStatus;
typedef enum : NSUInteger { MTLLanguageVersion3_0 = (3 << 16) } MTLLanguageVersion;
typedef enum : NSInteger { MTLMathModeSafe = 0, MTLMathModeRelaxed = 1, MTLMathModeFast = 2 } MTLMathMode;

@protocol MTLDevice;
@protocol MTLCommandBuffer;
@protocol MTLAllocation <NSObject>
@end
@protocol MTLResource <MTLAllocation>
@end
@protocol MTLBuffer <MTLResource>
- (void*)contents;
@property(readonly) NSUInteger length;
@property(readonly) uint64_t gpuAddress __attribute__((availability(macos, introduced = 13.0)));
@end
@protocol MTLFunction <NSObject>
@end
@interface MTLFunctionConstantValues : NSObject
- (void)setConstantValue:(const void*)value type:(MTLDataType)type atIndex:(NSUInteger)index;
@end
@protocol MTLLibrary <NSObject>
- (id<MTLFunction>)newFunctionWithName:(NSString*)name constantValues:(MTLFunctionConstantValues*)values error:(NSError**)error;
@end
@interface MTLCompileOptions : NSObject
@property MTLLanguageVersion languageVersion;
@property BOOL fastMathEnabled;
@property MTLMathMode mathMode __attribute__((availability(macos, introduced = 15.0)));
@end
@interface MTLComputePipelineDescriptor : NSObject
@property(strong) id<MTLFunction> computeFunction;
@property BOOL supportIndirectCommandBuffers;
@end
@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end
@protocol MTLIndirectComputeCommand <NSObject>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setKernelBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)concurrentDispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads;
- (void)setBarrier;
@end
@interface MTLIndirectCommandBufferDescriptor : NSObject
@property MTLIndirectCommandType commandTypes;
@property BOOL inheritBuffers;
@property BOOL inheritPipelineState;
@property NSUInteger maxKernelBufferBindCount;
@end
@protocol MTLIndirectCommandBuffer <MTLResource>
- (id<MTLIndirectComputeCommand>)indirectComputeCommandAtIndex:(NSUInteger)index;
@end
@interface MTLResidencySetDescriptor : NSObject
@property(copy) NSString* label;
@end
@protocol MTLResidencySet <NSObject>
- (void)addAllocation:(id<MTLAllocation>)allocation;
- (void)commit;
- (void)requestResidency;
@end
@protocol MTLComputeCommandEncoder <NSObject>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBufferOffset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads;
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage;
- (void)executeCommandsInBuffer:(id<MTLIndirectCommandBuffer>)buffer withRange:(NSRange)range;
- (void)endEncoding;
@end
typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);
@protocol MTLCommandBuffer <NSObject>
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)type;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)commit;
- (void)waitUntilCompleted;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
@end
@protocol MTLCommandQueue <NSObject>
- (id<MTLCommandBuffer>)commandBuffer;
- (void)addResidencySet:(id<MTLResidencySet>)set __attribute__((availability(macos, introduced = 15.0)));
- (void)removeResidencySet:(id<MTLResidencySet>)set __attribute__((availability(macos, introduced = 15.0)));
@end
@protocol MTLDevice <NSObject>
@property(readonly) NSString* name;
@property(readonly) NSUInteger maxBufferLength;
@property(readonly) uint64_t recommendedMaxWorkingSetSize;
@property(readonly) NSUInteger currentAllocatedSize;
- (BOOL)supportsFamily:(MTLGPUFamily)family;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(NSError**)error;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithDescriptor:(MTLComputePipelineDescriptor*)descriptor
                                                             options:(MTLPipelineOption)options
                                                          reflection:(id*)reflection
                                                               error:(NSError**)error;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytes:(const void*)pointer length:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer length:(NSUInteger)length options:(MTLResourceOptions)options
                              deallocator:(void (^)(void* pointer, NSUInteger length))deallocator;
- (id<MTLIndirectCommandBuffer>)newIndirectCommandBufferWithDescriptor:(MTLIndirectCommandBufferDescriptor*)descriptor
                                                        maxCommandCount:(NSUInteger)maxCount
                                                                options:(MTLResourceOptions)options;
- (id<MTLResidencySet>)newResidencySetWithDescriptor:(MTLResidencySetDescriptor*)descriptor
                                                error:(NSError**)error __attribute__((availability(macos, introduced = 15.0)));
@end
extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void);
