"""The program format: what the compiler produces and the engines run (WaferProgram, its regions,
stages and kernels), the compile options a program keeps, the schema a program read back is
checked against, and the layouts its kernels name (reduction trees, the KV cache)."""
