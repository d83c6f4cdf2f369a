#!/usr/bin/env python3
"""The CUDA driver's own start-up on this machine, with no gpq involved: load
libcuda, cuInit, then device 0's primary context (what any CUDA program pays
once per process). Device stage `first-read` runs it beside `gpq demo` so a
first read's "context" time can be compared with the driver's floor.
"""
import ctypes, time
t0 = time.perf_counter()
cu = ctypes.CDLL("libcuda.so.1")
t1 = time.perf_counter()
assert cu.cuInit(0) == 0
t2 = time.perf_counter()
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
t3 = time.perf_counter()
print(f"cuda floor: dlopen libcuda {1e3*(t1-t0):.1f} ms, cuInit {1e3*(t2-t1):.1f} ms, primary context {1e3*(t3-t2):.1f} ms, total {1e3*(t3-t0):.1f} ms")
