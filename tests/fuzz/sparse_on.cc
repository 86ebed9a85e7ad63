// Links a fuzz target in the large-input mode: its input files sparse and
// 6 GiB (fuzz_util.h, README.md).
namespace tlsprof::fuzz {
extern const bool kSparseInputs = true;
}  // namespace tlsprof::fuzz
