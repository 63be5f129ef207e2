// The C interface of libswitchserve_sentencepiece.so, the one library of ours
// that links libsentencepiece.
//
// Why a separate library: Debian's libsentencepiece.so.0 carries (and
// exports) its own copy of protobuf-lite 3.14, and its generated model code
// checks at load time that the process's protobuf runtime is 3.14. Any
// process that also links gRPC's libprotobuf (3.21) aborts on that check. So
// the engine loads this bridge with dlmopen(LM_ID_NEWLM) into a linker
// namespace of its own, where libsentencepiece gets its protobuf copy and its
// own C and C++ runtimes (sentencepiece_model.cc).
//
// Across that boundary only plain C data passes: the two sides have separate
// heaps, so every buffer is owned and allocated by the caller, and a handle is
// freed only by switchserve_spm_free. No function throws; each returns -1 (or
// null) on error with a NUL-terminated message in `error` (truncated to
// `error_size` bytes). Handles are immutable after loading; every function
// taking a const handle is safe from many threads at once.
#ifndef SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_BRIDGE_H_
#define SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_BRIDGE_H_

#include <stddef.h>
#include <stdint.h>

// Bumped whenever a signature below changes; the loader refuses a bridge of
// another version.
#define SWITCHSERVE_SPM_BRIDGE_VERSION 3

extern "C" {

int switchserve_spm_bridge_version(void);

// Loads a SentencePiece model file; null on failure.
void* switchserve_spm_load(const char* path, char* error, size_t error_size);
void switchserve_spm_free(void* processor);
int32_t switchserve_spm_piece_size(const void* processor);

// Encodes `text` (text_size bytes). Returns the number of ids, of which the
// first min(count, capacity) are written to `ids` and, when `ends` is not
// null, to `ends`: where each id's span of `text` ends, in bytes, as the
// library aligns its pieces to the text it was given (whitespace that
// normalisation removed belongs to a neighbouring piece's span). Call again
// with larger buffers when the count exceeds `capacity`.
int64_t switchserve_spm_encode(const void* processor, const char* text, size_t text_size,
                               int32_t* ids, uint64_t* ends, size_t capacity, char* error,
                               size_t error_size);

// Decodes `count` ids, each in [0, piece_size). Returns the text's size in
// bytes, of which the first min(size, capacity) are written to `text`.
int64_t switchserve_spm_decode(const void* processor, const int32_t* ids, size_t count, char* text,
                               size_t capacity, char* error, size_t error_size);

// The bytes piece `id` (in [0, piece_size)) adds to a decoded text: after
// other text when `first` is 0, as the text's first visible piece when it is
// 1 (where Decode drops a piece's leading space). A byte piece is its byte
// (also when it is no UTF-8 on its own), a control piece nothing, any other
// what Decode makes of it there. Returns the size in bytes, of which the
// first min(size, capacity) are written to `bytes`.
int64_t switchserve_spm_piece_bytes(const void* processor, int32_t id, int first, char* bytes,
                                    size_t capacity, char* error, size_t error_size);

}  // extern "C"

#endif  // SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_BRIDGE_H_
