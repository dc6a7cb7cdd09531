// safetensors I/O: 8-byte little-endian header length, a JSON header mapping names to
// {dtype, shape, data_offsets}, then raw little-endian data. The reader validates
// everything before any byte is used (header inside the file, well-formed JSON, known
// dtypes, offsets inside the data area and matching the shape, no overlaps), so a file
// from any source is safe to open.
#ifndef CLLA_MODEL_SAFETENSORS_H
#define CLLA_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/util.h"

enum { ST_F32 = 0, ST_BF16, ST_F16, ST_F64, ST_I32, ST_I64, ST_U8, ST_I8, ST_U16, ST_U32 };

#define ST_MAX_DIMS 8

typedef struct StEntry {
    char *name;
    int dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;       // byte range inside the data area
} StEntry;

typedef struct StFile {
    char *path;
    FILE *f;
    uint64_t data_start;       // 8 + header length
    uint64_t data_size;
    StEntry *e;
    int n;
    char *metadata_json;       // "__metadata__" object as JSON text, or NULL
} StFile;

// Validates a header (the JSON text of length hdr_len) for a file of file_size bytes.
// Returns 0, or -1 with a one-line reason in err. Pure: used by st_open and by the fuzzer.
int st_parse_header(StFile *sf, const char *hdr, uint64_t hdr_len, uint64_t file_size, char *err, size_t errlen);
// Opens and validates path. Returns 0, or -1 with the reason in err.
int st_open(StFile *sf, const char *path, char *err, size_t errlen);
void st_close(StFile *sf);
int st_find(const StFile *sf, const char *name);          // index or -1
size_t st_dtype_size(int dtype);
const char *st_dtype_name(int dtype);
// Reads entry i converted to fp32 (from F32, BF16, F16 or F64) into out (numel floats).
// Returns 0, or -1 with the reason in err.
int st_read_f32(StFile *sf, int i, float *out, char *err, size_t errlen);

// Writer. Tensors are fp32 on the host; out_dtype ST_F32 or ST_BF16 (round to nearest even).
typedef struct StTensor {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;
} StTensor;
// Writes atomically (temporary + fsync + rename; mode as in common/util.h's AtomicFile).
// metadata_json: a JSON object text of string values, or NULL. Returns 0, or -1 with the reason
// in err (nothing left behind, but for the finished file kept when OUT_KEEP_EXISTING found path
// taken, which err names).
int st_save(const char *path, OutMode mode, const StTensor *t, int n, int out_dtype, const char *metadata_json,
            char *err, size_t errlen);

// A model's weights as users have them: one file, or Hugging Face shards
// (model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {name: file}}
// beside model-00001-of-0000N.safetensors ...). Every shard is validated as a single file is,
// every tensor of the index is found in the shard the index names, and no tensor is in two
// shards or missing from the index.
#define ST_SINGLE_FILE "model.safetensors"
#define ST_INDEX_FILE "model.safetensors.index.json"
// Is name a shard's name as a save writes it, model-<digits>-of-<digits>.safetensors? A later save
// removes only such files (and the two above) of what an earlier index named.
int st_is_shard_name(const char *name);
typedef struct StRef {
    const char *name;          // the entry's name (owned by the StFile)
    int file, idx;             // files[file].e[idx]
} StRef;
typedef struct StSet {
    StFile *files;
    int n_files;
    StRef *refs;               // every tensor, sorted by name
    int n;
} StSet;
// path: a .safetensors file, an index .json, or a directory holding model.safetensors or
// model.safetensors.index.json (not both). Returns 0, or -1 with the reason in err.
int st_set_open(StSet *s, const char *path, char *err, size_t errlen);
void st_set_close(StSet *s);
int st_set_find(const StSet *s, const char *name);       // index into refs, or -1 (binary search)
const StEntry *st_set_entry(const StSet *s, int r);
int st_set_read_f32(StSet *s, int r, float *out, char *err, size_t errlen);

// Writes the tensors into directory dir: dir/model.safetensors when shard_bytes is 0 or all
// tensors fit in one shard (as HF does), else shards of at most shard_bytes data bytes each (a
// tensor larger than that gets a shard of its own) named model-00001-of-0000N.safetensors and
// the index. Shards are written under temporary names, renamed when all are complete, then the
// index; a save id in every shard's __metadata__ and in the index lets the reader refuse a set
// mixed by an interrupted save. Files of the previous save that the new one does not use
// (model.safetensors, the old index and shards) are removed after the new one is complete.
int st_save_dir(const char *dir, const StTensor *t, int n, int out_dtype, const char *metadata_json,
                unsigned long long shard_bytes, char *err, size_t errlen);

#endif
