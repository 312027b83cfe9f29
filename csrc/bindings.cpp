// bindings.cpp — the only pybind11 file: the Python face of the engine, with argument checks that
// name the parameter, its shape and what was expected. brrr::Error -> RuntimeError (ValueError
// for bad arguments), brrr::OutOfMemory -> MemoryError.
//
// Python API of llama_brrr._C:
//   cuda_compiled() -> bool                   built with nvcc
//   cuda_device_count() -> int                0 without a GPU or driver (never raises)
//   cpu_simd() -> str                         SIMD path the CPU kernels were built for
//   Engine(backend: "cpu"|"cuda", config: dict, dtype: "f32"|"f16"|"bf16", device: int = 0,
//          n_threads: int = 0)              config keys: ModelConfig.engine_dict()
//     .config -> dict
//     .set_weight(name, array, dtype)        array: C-contiguous numpy; dtype "f32"|"f16"|"bf16"
//                                            (bf16 arrays are passed as their uint16 bits)
//     .get_weight(name) -> np.ndarray[f32]
//     .init_random(seed, std)
//     .prefill(slot, tokens[int32 T], start_pos, logits: "none"|"last"|"all") -> ndarray | None
//     .decode(tokens[int32 B], slots[int32 B], positions[int32 B], logits: bool) -> ndarray | None
//     .sample(slots[int32 B], positions[int32 B], temperature[f32 B], top_k[int32 B],
//             top_p[f32 B], min_p[f32 B], repetition_penalty[f32 B], seed[uint64 B],
//             step[uint64 B]) -> (tokens[int32 B], logprobs[f32 B])
//        samples from the logits of the most recent prefill (B = 1) or decode (row i = sequence i);
//        repetition penalty covers the slot's tokens at positions [0, positions[i]].
//   cpu_ops: the CPU kernels on numpy arrays, for tests (see the CPU section below)
//   cuda_ops: the CUDA launchers on device pointers (ints, e.g. torch's data_ptr()), for tests
