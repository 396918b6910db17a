// workspace_alloc.cu -- device memory for the workspaces through the driver's virtual memory
// API, compressible where the device has compute data compression (bl_workspace_alloc in
// backlite.h). Why: the backward's fp32 dq accumulator is written as zeros ahead of the main
// kernel and read back after it; in compressible memory the zero lines take fewer DRAM bytes.
// A standalone probe shaped like the preprocess and the postprocess (bench/results/
// bwd-s80-compressible-probe.txt): accumulator zeros 35 -> 25 us at 16k x 16 x 128 (134 MB),
// 105 -> 79 us at 32k x 24 (403 MB); reads of tiles left at zero 53 -> 41 us; the same results.
// The driver's functions come through the runtime's entry points (no -lcuda), as
// tensor_map.cuh does for the tensor maps.
#include <stddef.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include "backend.h"

namespace {

// The driver functions this file uses, found once (C++ static initialisation is thread-safe).
struct vmm_driver {
    decltype(&cuDeviceGet) device_get = nullptr;
    decltype(&cuDeviceGetAttribute) attribute = nullptr;
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) address_free = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    bool ok = false;
};

template <typename F>
bool driver_fn(const char *name, F *fn) {
    void *ptr = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || ptr == nullptr) {
        (void)cudaGetLastError();
        return false;
    }
    *fn = reinterpret_cast<F>(ptr);
    return true;
}

const vmm_driver &vmm() {
    static const vmm_driver d = [] {
        vmm_driver v;
        v.ok = driver_fn("cuDeviceGet", &v.device_get) &&
               driver_fn("cuDeviceGetAttribute", &v.attribute) &&
               driver_fn("cuMemGetAllocationGranularity", &v.granularity) &&
               driver_fn("cuMemCreate", &v.create) &&
               driver_fn("cuMemRelease", &v.release) &&
               driver_fn("cuMemAddressReserve", &v.reserve) &&
               driver_fn("cuMemAddressFree", &v.address_free) &&
               driver_fn("cuMemMap", &v.map) && driver_fn("cuMemUnmap", &v.unmap) &&
               driver_fn("cuMemSetAccess", &v.set_access);
        return v;
    }();
    return d;
}

CUmemAllocationProp device_memory(int device, bool compressible) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.compressionType =
        compressible ? CU_MEM_ALLOCATION_COMP_GENERIC : CU_MEM_ALLOCATION_COMP_NONE;
    return prop;
}

// Bytes of a mapping of `bytes`: whole granules of the device's recommended granularity.
size_t mapped_bytes(const vmm_driver &d, int device, size_t bytes) {
    CUmemAllocationProp prop = device_memory(device, false);
    size_t gran = 0;
    if (d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
        gran == 0)
        return 0;
    return (bytes + gran - 1) / gran * gran;
}

}  // namespace

extern "C" int bl_cuda_workspace_compressible(int device) {
    const vmm_driver &d = vmm();
    CUdevice dev;
    int supported = 0;
    if (!d.ok || d.device_get(&dev, device) != CUDA_SUCCESS ||
        d.attribute(&supported, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev) !=
            CUDA_SUCCESS)
        return 0;
    return supported != 0;
}

extern "C" void *bl_cuda_workspace_alloc(size_t bytes, int device) {
    const vmm_driver &d = vmm();
    if (!d.ok || bytes == 0) return nullptr;
    const size_t size = mapped_bytes(d, device, bytes);
    if (size == 0) return nullptr;
    // Compressible where the device has it (the driver may still hand back plain memory), else
    // plain: the workspace works either way.
    CUmemAllocationProp prop = device_memory(device, bl_cuda_workspace_compressible(device) != 0);
    CUmemGenericAllocationHandle handle;
    if (d.create(&handle, size, &prop, 0) != CUDA_SUCCESS) {
        prop = device_memory(device, false);
        if (d.create(&handle, size, &prop, 0) != CUDA_SUCCESS) return nullptr;
    }
    CUdeviceptr ptr = 0;
    if (d.reserve(&ptr, size, 0, 0, 0) != CUDA_SUCCESS) {
        d.release(handle);
        return nullptr;
    }
    if (d.map(ptr, size, 0, handle, 0) != CUDA_SUCCESS) {
        d.address_free(ptr, size);
        d.release(handle);
        return nullptr;
    }
    d.release(handle);  // the mapping keeps the memory until bl_cuda_workspace_free unmaps it
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d.set_access(ptr, size, &access, 1) != CUDA_SUCCESS) {
        d.unmap(ptr, size);
        d.address_free(ptr, size);
        return nullptr;
    }
    return reinterpret_cast<void *>(ptr);
}

extern "C" void bl_cuda_workspace_free(void *ptr, size_t bytes) {
    const vmm_driver &d = vmm();
    // The granule from the current device, not a device argument: PyTorch's documentation gives
    // the free function (ptr, size, stream) and its code (ptr, size, device, stream); ptr and
    // size are the same in both, and every device of a node has the same granularity.
    int device = 0;
    if (!d.ok || ptr == nullptr || cudaGetDevice(&device) != cudaSuccess) return;
    const size_t size = mapped_bytes(d, device, bytes);
    if (size == 0) return;
    // as cudaFree: nothing queued may still use the memory when it goes
    (void)cudaDeviceSynchronize();
    d.unmap(reinterpret_cast<CUdeviceptr>(ptr), size);
    d.address_free(reinterpret_cast<CUdeviceptr>(ptr), size);
}
