// research/probes/step_marks.py: one thread writes the global timer (ns) to marks[i].
extern "C" __global__ void mark(unsigned long long* marks, int i) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  marks[i] = t;
}

// The same for a programmatic launch (--every-launch, sm_90+): it waits for the kernel before it
// (so the time is that kernel's completion, give or take the wake-up), then lets the next start.
extern "C" __global__ void mark_pdl(unsigned long long* marks, int i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  marks[i] = t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
