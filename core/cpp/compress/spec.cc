// Compressor kwargs: the canonical text ("key=value;key=value", keys in order) and its parser,
// and the checks of every key and value (compressor.h). The parser reads text from peers, so
// it is bound-checked: at most kMaxSpecChars characters and kMaxPairs pairs, no empty key, no
// duplicate key, no '=' inside a value, no control characters; anything else is an error that
// quotes (a bounded, escaped piece of) the offending text.
//
// Values (upstream's HyperParamFinder, made strict: the whole value must parse):
//   compressor_type            onebit | topk | randomk | dithering | fp16
//   compressor_k               topk / randomk: > 0; below 1 a fraction of the elements
//                              (k = float32(k) * bytes / element size, truncated, at least 1,
//                              upstream's float32 arithmetic), else an integer count < 2^32.
//                              dithering: the levels, an integer >= 1 (linear: <= 2^24;
//                              natural: <= 31, i.e. 2^(k-1) levels). Other types: unused,
//                              but it must still be a number > 0.
//   compressor_onebit_scaling  true | false | 1 | 0 (any case); default false
//   seed                       decimal integer in [0, 2^64); 0 or absent: a random seed
//   dithering_partition        0 (linear, default) | 1 (natural)
//   dithering_normalize        0 (max, default) | 1 (l2)
//   ef_type                    vanilla (needs compressor_type)
//   momentum_type              nesterov (needs compressor_type and momentum_mu)
//   momentum_mu                a number in [0, 1)
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>

#include "internal.h"

namespace byteps {
namespace compress {

namespace {

constexpr size_t kMaxSpecChars = 4096;
constexpr size_t kMaxPairs = 64;
constexpr size_t kQuoteChars = 48;

const char* const kKnownKeys[] = {
    "compressor_type", "compressor_k",  "compressor_onebit_scaling",
    "seed",            "dithering_partition", "dithering_normalize",
    "ef_type",         "momentum_type", "momentum_mu",
};

// 'text' with control and non-ASCII bytes escaped, cut at kQuoteChars characters.
std::string Quote(const std::string& text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size(); ++i) {
    if (i == kQuoteChars) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

bool IsKnownKey(const std::string& key) {
  for (const char* k : kKnownKeys) {
    if (key == k) return true;
  }
  return false;
}

std::string KnownKeys() {
  std::string out;
  for (const char* k : kKnownKeys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

Status Bad(const std::string& key, const std::string& value, const std::string& why) {
  return Status::InvalidArgument("compressor kwarg " + key + "=" + Quote(value) + ": " + why);
}

// A finite decimal number, the whole text (no sign '+', no spaces, no inf/nan).
bool ParseNumber(const std::string& text, double* out) {
  if (text.empty() || text.size() > 64) return false;
  const char* end = text.data() + text.size();
  auto res = std::from_chars(text.data(), end, *out, std::chars_format::general);
  return res.ec == std::errc() && res.ptr == end && std::isfinite(*out);
}

// A decimal integer in [0, 2^64), digits only.
bool ParseUnsigned(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  const char* end = text.data() + text.size();
  auto res = std::from_chars(text.data(), end, *out);
  return res.ec == std::errc() && res.ptr == end;
}

// An integral number (written "5" or "5.0"...) in [lo, hi].
bool ParseIntegral(const std::string& text, uint64_t lo, uint64_t hi, uint64_t* out) {
  double d;
  if (!ParseNumber(text, &d) || d != std::floor(d)) return false;
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) return false;
  *out = static_cast<uint64_t>(d);
  return true;
}

bool ParseBool(const std::string& text, bool* out) {
  std::string t;
  for (char c : text) t += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (t == "true" || t == "1") {
    *out = true;
    return true;
  }
  if (t == "false" || t == "0") {
    *out = false;
    return true;
  }
  return false;
}

bool ParseFlag(const std::string& text, bool* out) {
  if (text == "0" || text == "1") {
    *out = text == "1";
    return true;
  }
  return false;
}

Status ParseK(const std::string& value, detail::Params* p) {
  const std::string key = "compressor_k";
  using detail::CodecType;
  if (p->has_compressor && p->type == CodecType::kDithering) {
    const uint64_t hi = p->dithering_natural ? detail::kMaxNaturalK : detail::kMaxLinearLevels;
    if (!ParseIntegral(value, 1, hi, &p->k_count)) {
      return Bad(key, value,
                 std::string("dithering takes an integer number of levels in [1, ") +
                     std::to_string(hi) + "] for the " +
                     (p->dithering_natural ? "natural" : "linear") + " partition");
    }
    return Status::OK();
  }
  double d;
  if (!ParseNumber(value, &d) || !(d > 0)) {
    return Bad(key, value, "must be a number > 0");
  }
  if (!p->has_compressor || (p->type != CodecType::kTopk && p->type != CodecType::kRandomk)) {
    return Status::OK();  // not used by this compressor
  }
  const float f = static_cast<float>(d);
  if (f < 1.0f) {
    p->k_is_fraction = true;
    p->k_fraction = f;
    return Status::OK();
  }
  if (!ParseIntegral(value, 1, 0xffffffffull, &p->k_count)) {
    return Bad(key, value,
               "must be a fraction in (0, 1) of the elements or an integer count in "
               "[1, 2^32)");
  }
  return Status::OK();
}

}  // namespace

std::string FormatSpec(const Kwargs& kw) {
  std::string out;
  for (const auto& [key, value] : kw) {
    if (!out.empty()) out += ';';
    out += key;
    out += '=';
    out += value;
  }
  return out;
}

Status ParseSpec(const std::string& spec, Kwargs* out) {
  out->clear();
  if (spec.size() > kMaxSpecChars) {
    return Status::InvalidArgument("compressor spec of " + std::to_string(spec.size()) +
                                   " characters is longer than " +
                                   std::to_string(kMaxSpecChars));
  }
  if (spec.empty()) return Status::OK();
  size_t pos = 0;
  while (true) {
    const size_t semi = spec.find(';', pos);
    const std::string pair =
        spec.substr(pos, semi == std::string::npos ? std::string::npos : semi - pos);
    for (char c : pair) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        return Status::InvalidArgument("compressor spec pair " + Quote(pair) +
                                       " has a control character");
      }
    }
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("compressor spec pair " + Quote(pair) +
                                     " is not key=value");
    }
    const std::string key = pair.substr(0, eq);
    const std::string value = pair.substr(eq + 1);
    if (key.empty()) {
      return Status::InvalidArgument("compressor spec pair " + Quote(pair) + " has an empty key");
    }
    if (value.find('=') != std::string::npos) {
      return Status::InvalidArgument("compressor spec pair " + Quote(pair) +
                                     " has '=' in its value");
    }
    if (out->size() == kMaxPairs) {
      return Status::InvalidArgument("compressor spec has more than " +
                                     std::to_string(kMaxPairs) + " pairs");
    }
    if (!out->emplace(key, value).second) {
      return Status::InvalidArgument("compressor spec repeats the key " + Quote(key));
    }
    if (semi == std::string::npos) break;
    pos = semi + 1;
  }
  return Status::OK();
}

namespace detail {

Status ParseParams(const Kwargs& kw, DType dtype, Params* p) {
  *p = Params();
  for (const auto& [key, value] : kw) {
    if (!IsKnownKey(key)) {
      return Status::InvalidArgument("unknown compressor kwarg " + Quote(key) + " (known: " +
                                     KnownKeys() + ")");
    }
    if (value.find(';') != std::string::npos || value.find('=') != std::string::npos) {
      return Bad(key, value, "';' and '=' are not allowed in a value");
    }
  }
  auto find = [&](const char* key) -> const std::string* {
    auto it = kw.find(key);
    return it == kw.end() ? nullptr : &it->second;
  };

  if (const std::string* v = find("compressor_type")) {
    static const struct {
      const char* name;
      CodecType type;
    } kTypes[] = {{"onebit", CodecType::kOnebit},
                  {"topk", CodecType::kTopk},
                  {"randomk", CodecType::kRandomk},
                  {"dithering", CodecType::kDithering},
                  {"fp16", CodecType::kFp16}};
    for (const auto& t : kTypes) {
      if (*v == t.name) {
        p->has_compressor = true;
        p->type = t.type;
      }
    }
    if (!p->has_compressor) {
      return Bad("compressor_type", *v, "unknown (onebit, topk, randomk, dithering, fp16)");
    }
    if (dtype != DType::kFloat16 && dtype != DType::kFloat32 && dtype != DType::kFloat64) {
      return Bad("compressor_type", *v,
                 std::string("compresses float16, float32 and float64 tensors, not ") +
                     DTypeName(dtype));
    }
  }
  if (const std::string* v = find("dithering_partition")) {
    if (!ParseFlag(*v, &p->dithering_natural)) {
      return Bad("dithering_partition", *v, "must be 0 (linear) or 1 (natural)");
    }
  }
  if (const std::string* v = find("dithering_normalize")) {
    if (!ParseFlag(*v, &p->dithering_l2)) {
      return Bad("dithering_normalize", *v, "must be 0 (max) or 1 (l2)");
    }
  }
  if (const std::string* v = find("compressor_k")) {
    BPS_RETURN_IF_ERROR(ParseK(*v, p));
  } else if (p->has_compressor &&
             (p->type == CodecType::kTopk || p->type == CodecType::kRandomk ||
              p->type == CodecType::kDithering)) {
    return Status::InvalidArgument("compressor kwarg compressor_k is required by compressor_type=" +
                                   kw.at("compressor_type"));
  }
  if (const std::string* v = find("compressor_onebit_scaling")) {
    if (!ParseBool(*v, &p->onebit_scaling)) {
      return Bad("compressor_onebit_scaling", *v, "must be true, false, 1 or 0");
    }
  }
  if (const std::string* v = find("seed")) {
    if (!ParseUnsigned(*v, &p->seed)) {
      return Bad("seed", *v, "must be a decimal integer in [0, 2^64)");
    }
    p->has_seed = p->seed != 0;
  }
  if (const std::string* v = find("ef_type")) {
    if (*v != "vanilla") return Bad("ef_type", *v, "unknown (vanilla)");
    if (!p->has_compressor) return Bad("ef_type", *v, "needs a compressor_type");
    p->error_feedback = true;
  }
  const std::string* mu = find("momentum_mu");
  if (mu) {
    double d;
    if (!ParseNumber(*mu, &d) || !(d >= 0 && d < 1)) {
      return Bad("momentum_mu", *mu, "must be a number in [0, 1)");
    }
    p->momentum_mu = d;
  }
  if (const std::string* v = find("momentum_type")) {
    if (*v != "nesterov") return Bad("momentum_type", *v, "unknown (nesterov)");
    if (!p->has_compressor) return Bad("momentum_type", *v, "needs a compressor_type");
    if (!mu) return Bad("momentum_type", *v, "needs momentum_mu");
    p->momentum = true;
  }
  return Status::OK();
}

}  // namespace detail

Status Validate(const Kwargs& kw, DType dtype) {
  detail::Params p;
  return detail::ParseParams(kw, dtype, &p);
}

}  // namespace compress
}  // namespace byteps
