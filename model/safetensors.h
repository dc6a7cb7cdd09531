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
// Writes atomically (temporary + fsync + rename). metadata_json: a JSON object text of
// string values, or NULL. Returns 0, or -1 with the reason in err (nothing left behind).
int st_save(const char *path, const StTensor *t, int n, int out_dtype, const char *metadata_json,
            char *err, size_t errlen);

#endif
