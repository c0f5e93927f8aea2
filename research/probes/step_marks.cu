// research/probes/step_marks.py: one thread writes the global timer (ns) to marks[i].
extern "C" __global__ void mark(unsigned long long* marks, int i) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  marks[i] = t;
}
