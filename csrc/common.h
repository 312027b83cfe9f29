// common.h — the error-check vocabulary, dtype helpers and small macros both backends share.
//
// Every failure the engine can detect becomes a brrr::Error carrying "file:line: message";
// the bindings (csrc/bindings/) turn it into a Python exception, so nothing here ever aborts the process.
#pragma once

#include <cstdint>
#include <cstring>
#include <cstdio>
#include <type_traits>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define BRRR_HOST_DEVICE __host__ __device__
#else
#define BRRR_HOST_DEVICE
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

namespace brrr {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// An allocation the device or host could not satisfy; bindings map it to MemoryError.
struct OutOfMemory : Error {
    using Error::Error;
};
// A caller's argument breaks a rule of the call (a slot, position or token out of range); the
// message names the argument, so it carries no file:line. Bindings map it to ValueError.
struct InvalidArgument : Error {
    using Error::Error;
};

// Message: the string builder of every error message. It formats with std::to_string rather
// than iostreams: on the GPU machine (g++ 13, Python 3.12) an ostringstream inside the extension
// crashed the process on the first error it formatted, so no message goes through iostreams.
class Message {
public:
    Message& operator<<(const std::string& v) { text_ += v; return *this; }
    Message& operator<<(const char* v) { text_ += v ? v : "(null)"; return *this; }
    Message& operator<<(char v) { text_ += v; return *this; }
    Message& operator<<(bool v) { text_ += v ? "true" : "false"; return *this; }
    template <class T, class = typename std::enable_if<std::is_arithmetic<T>::value>::type>
    Message& operator<<(T v) { text_ += number(v); return *this; }
    const std::string& str() const { return text_; }

private:
    template <class T>
    static std::string number(T v) {
        if (std::is_floating_point<T>::value) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%g", (double)v);
            return buf;
        }
        return std::to_string(v);
    }
    std::string text_;
};

inline std::string where(const char* file, int line) {
    const char* base = std::strrchr(file, '/');
    return std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": ";
}

}  // namespace brrr

// BRRR_CHECK(cond, "message " << value): throws brrr::Error with file:line when cond is false.
#define BRRR_CHECK(cond, msg)                                               \
    do {                                                                    \
        if (!(cond)) {                                                      \
            brrr::Message brrr_os_;                                    \
            brrr_os_ << brrr::where(__FILE__, __LINE__) << msg;             \
            throw brrr::Error(brrr_os_.str());                              \
        }                                                                   \
    } while (0)

#define BRRR_FAIL(msg) BRRR_CHECK(false, msg)

// BRRR_CHECK_ARG(cond, "slot " << slot << " ..."): throws brrr::InvalidArgument when cond is false.
#define BRRR_CHECK_ARG(cond, msg)                                           \
    do {                                                                    \
        if (!(cond)) {                                                      \
            brrr::Message brrr_os_;                                         \
            brrr_os_ << msg;                                                \
            throw brrr::InvalidArgument(brrr_os_.str());                    \
        }                                                                   \
    } while (0)

namespace brrr {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
    return t == DType::F32 ? "f32" : t == DType::F16 ? "f16" : "bf16";
}

// bf16 is the top half of an fp32; round to nearest even on the way down.
BRRR_HOST_DEVICE inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
BRRR_HOST_DEVICE inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
// IEEE half -> float without relying on F16C (the SIMD kernels use F16C where present).
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: renormalize
            int e = -1;
            do { mant <<= 1; ++e; } while (!(mant & 0x400u));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | mant << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

}  // namespace brrr
