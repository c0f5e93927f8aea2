"""Probe: can a kernel read (and so prefetch into L2) another kernel's code through the address
that device code gets for it (`&kernel`, PTX `mov.u64 d, kernel`, filled in by the driver from a
relocation in constant bank 4)? Compares the bytes read on the GPU with the cubin's .text section.

    python research/probes/code_address.py [sm_90] [run]     (without `run`: compile only, no GPU)

Answer on the H200 (thirty-fourth session, driver 580 / CUDA 13.0): no. The load faults
(CUDA_ERROR_ILLEGAL_ADDRESS): whatever that value is, it is not readable as data. L2 prefetches
of it (`prefetch.global.L2`, research/ddtree_build.md) do not fault and make the build slower."""
import struct, sys
import numpy as np
from driverlevel._compile import compile_source

SRC = r'''
extern "C" __global__ void target_kernel(float* y, int n);
extern "C" __global__ void probe(unsigned long long* out) {
  unsigned long long a;
  asm volatile("mov.b64 %0, %1;" : "=l"(a) : "l"(reinterpret_cast<unsigned long long>(reinterpret_cast<const void*>(&target_kernel))));
  out[0] = a;
  const unsigned long long* c = reinterpret_cast<const unsigned long long*>(a);
  for (int i = 0; i < 8; ++i) out[1 + i] = c[i];
  asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(a));
}
extern "C" __global__ void target_kernel(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = y[i] * 3.0f + 1.0f;
}
'''

def text_section(elf: bytes, name: str) -> bytes:
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stro = secs[shstrndx][4]
    for s in secs:
        nm = elf[stro + s[0]: elf.index(b"\0", stro + s[0])].decode()
        if nm == ".text." + name:
            return elf[s[4]: s[4] + s[5]]
    raise KeyError(name)

arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
cub = compile_source(SRC, "codeaddr.cu", arch)
print("compiled", arch, sorted(cub.resources))
want = text_section(cub.data, "target_kernel")[:64]
print("cubin .text.target_kernel[:64]", want.hex())
if len(sys.argv) > 2 and sys.argv[2] == "run":
    import driverlevel as dl
    dev = dl.Device(0)
    mod = dl.load_module(dev, cub)
    print("loaded", mod)
    out = dl.DeviceBuffer.allocate(dev, 128, label="probe").as_array((16,), np.uint64)
    stream = dev.create_stream()
    k = mod.kernel("probe")
    k.launch(stream, 1, 1, [out])
    stream.synchronize()
    got = out.to_numpy()
    print("address from mov.u64 target_kernel: 0x%x" % int(got[0]))
    g = got[1:9].tobytes()
    print("read at that address     [:64]", g.hex())
    print("MATCH" if g == want else "DIFFERENT")
