// The one source of lamp_programs_pch (CMakeLists.txt): a target that only
// exists to precompile <torch/torch.h> once for lamp's one-file programs
// (examples, benchmarks, test workers), which reuse it.
