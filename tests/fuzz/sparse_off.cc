// Links a fuzz target with its input files as they are (fuzz_util.h).
namespace tlsprof::fuzz {
extern const bool kSparseInputs = false;
}  // namespace tlsprof::fuzz
