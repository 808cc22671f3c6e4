// FlagSet<T>: a program's flags bound to the fields of its options struct T, declared once.
//
//   struct Options { int window = 32; std::optional<int64_t> kv_bytes; bool graphs = true; };
//   flags::FlagSet<Options> f;
//   f.Int("window", "W", "eviction window", [](auto& o) -> auto& { return o.window; }, 1, 1 << 20)
//    .Bytes("kv-cache-bytes", "SIZE", "KV pool", [](auto& o) -> auto& { return o.kv_bytes; }, 1)
//    .Switch("no-cuda-graphs", "launch every op", [](auto& o) -> auto& { return o.graphs; },
//    false);
//   Options o;                                  // the defaults
//   RECALL_RETURN_IF_ERROR(f.Parse(argv, &o));  // "--window: must be in [1, 1048576], got 0"
//   std::vector<std::string> argv2 = f.Render(o);  // the flags that reproduce o's non-defaults
//
// Parse takes --name VALUE, --name=VALUE and switches (and -x VALUE, -x=VALUE where Short
// declared -x for a flag, as llama.cpp's -m -p -n -s -t), checks each value's type and range and
// names the flag in every error; an unknown flag is refused with the closest known name, a
// positional argument is refused, and flags declared Exclusive may not be given together.
// Render lets a parent process forward its options to a child from the same table (recall
// serve -> recall-worker), so a flag is spelled once. Accessors are generic lambdas returning
// a reference to the field (they are called on T& and on const T&). Field types: bool (Switch),
// int, int64_t, double, float, std::string, std::optional of those, std::vector<int> (a comma
// list). A string value may not be empty (an unset shell variable would pass for "use the
// default"), except a Text's. Thread safety: a FlagSet is immutable once built; Parse and Render
// are const.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace recall::flags {

template <typename V>
struct IsOptional : std::false_type {};
template <typename V>
struct IsOptional<std::optional<V>> : std::true_type {};

// A lower bound that takes a number above 0 (not 0 itself): its range reads "(0, HI]". The
// least normal float, so that a value taken stays above 0 where the field is sent as a float
// (--top-p 1e-50 became 0 and was refused later, naming the proto's field).
inline constexpr double kAboveZero = std::numeric_limits<float>::min();

// Parsers of one value; errors say what was expected, without the flag's name.
absl::Status ParseInt(absl::string_view text, int64_t lo, int64_t hi, int64_t* out);
absl::Status ParseDouble(absl::string_view text, double lo, double hi, double* out);
// A byte size: "1048576", "512M", "2GiB", "1.5GB" (K/M/G and KiB/MiB/GiB binary, KB/MB/GB
// decimal).
absl::Status ParseBytes(absl::string_view text, int64_t lo, int64_t* out);
absl::Status ParseIntList(absl::string_view text, int64_t lo, int64_t hi, std::vector<int>* out);
std::string FormatDouble(double v);  // round-trips through ParseDouble
// The known name closest to `name` by edit distance, or "" when none is close.
std::string Closest(absl::string_view name, const std::vector<std::string>& known);

// An error about an option field, for code that never sees flags: InvalidArgument (or
// `code`) with the message "field: what" and the field's name in a payload, so a main can
// name the flag instead (FlagSet::Explain). `what` may name other fields as "{field}":
// the message says "field", Explain says its flag.
absl::Status FieldError(absl::string_view field, absl::string_view what,
                        absl::StatusCode code = absl::StatusCode::kInvalidArgument);
// "HOST:PORT" (PORT in [0, 65535]; "[::1]:80" for IPv6) -> host without brackets, port; a
// FieldError naming `field` otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view field,
                                                          const std::string& value);
// The field a FieldError names, or ""; its `what` as given ({field} references kept).
std::string FieldOf(const absl::Status& status);
std::string FieldWhat(const absl::Status& status);
// `what` with each "{field}" replaced by name(field).
std::string FillFields(absl::string_view what,
                       const std::function<std::string(absl::string_view)>& name);

// The refusal of an empty value for a flag that takes a path, an address or a name.
inline constexpr char kEmptyValue[] = "empty; omit the flag for its default";

template <typename T>
class FlagSet {
 public:
  struct Flag {
    std::string name;        // without "--"
    std::string value_name;  // "N", "SIZE"; empty for a switch
    std::string help;
    std::string section;
    std::string field;  // the option field (FieldError's name) it sets; default: name with '_'
    std::function<absl::Status(T&, absl::string_view)> set;
    std::function<std::vector<std::string>(const T&)> render;  // empty: default, not rendered
  };

  FlagSet& Section(std::string title) {
    section_ = std::move(title);
    return *this;
  }

  // Any value field (see the header comment for the types); numbers are range-checked.
  template <typename A>
  FlagSet& Value(std::string name, std::string value_name, std::string help, A access,
                 double lo = -1e300, double hi = 1e300) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access, lo, hi](T& o, absl::string_view text) {
      return Assign(access(o), text, lo, hi);
    };
    f.render = [access, name = f.name](const T& o) {
      return RenderValue(name, access(o), access(Defaults()));
    };
    return Add(std::move(f));
  }
  template <typename A>
  FlagSet& Int(std::string name, std::string value_name, std::string help, A access, int64_t lo,
               int64_t hi) {
    return Value(std::move(name), std::move(value_name), std::move(help), access,
                 static_cast<double>(lo), static_cast<double>(hi));
  }
  template <typename A>
  FlagSet& Double(std::string name, std::string value_name, std::string help, A access, double lo,
                  double hi) {
    return Value(std::move(name), std::move(value_name), std::move(help), access, lo, hi);
  }
  // A string that is not empty (a path, an address, a name); Text for free text.
  template <typename A>
  FlagSet& String(std::string name, std::string value_name, std::string help, A access) {
    return Value(std::move(name), std::move(value_name), std::move(help), access);
  }
  // A free text (a prompt, a system message) that may be empty, unlike String's values.
  template <typename A>
  FlagSet& Text(std::string name, std::string value_name, std::string help, A access) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access](T& o, absl::string_view text) {
      access(o) = std::string(text);
      return absl::OkStatus();
    };
    f.render = [access, name = f.name](const T& o) {
      return RenderValue(name, access(o), access(Defaults()));
    };
    return Add(std::move(f));
  }
  // A string (or optional string) field whose value must be one of `choices`.
  template <typename A>
  FlagSet& Choice(std::string name, std::string value_name, std::string help, A access,
                  std::vector<std::string> choices) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access, choices](T& o, absl::string_view text) -> absl::Status {
      for (const std::string& c : choices) {
        if (c == text) {
          access(o) = std::string(text);
          return absl::OkStatus();
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\" is not one of ", Join(choices)));
    };
    f.render = [access, name = f.name](const T& o) {
      return RenderValue(name, access(o), access(Defaults()));
    };
    return Add(std::move(f));
  }
  // An enum (or optional enum) field, by name.
  template <typename A, typename E>
  FlagSet& Enum(std::string name, std::string value_name, std::string help, A access,
                std::vector<std::pair<std::string, E>> values) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access, values](T& o, absl::string_view text) -> absl::Status {
      std::vector<std::string> names;
      for (const auto& [n, v] : values) {
        if (n == text) {
          access(o) = v;
          return absl::OkStatus();
        }
        names.push_back(n);
      }
      return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not one of ", Join(names)));
    };
    f.render = [access, values, name = f.name](const T& o) -> std::vector<std::string> {
      const auto& v = access(o);
      if (v == access(Defaults())) return {};
      E e{};
      if constexpr (IsOptional<std::decay_t<decltype(v)>>::value) {
        if (!v.has_value()) return {};
        e = *v;
      } else {
        e = v;
      }
      for (const auto& [n, x] : values) {
        if (x == e) return {"--" + name, n};
      }
      return {};
    };
    return Add(std::move(f));
  }
  // An int64_t (or optional int64_t) field given as a size ("512M").
  template <typename A>
  FlagSet& Bytes(std::string name, std::string value_name, std::string help, A access, int64_t lo) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access, lo](T& o, absl::string_view text) -> absl::Status {
      int64_t v = 0;
      if (absl::Status st = ParseBytes(text, lo, &v); !st.ok()) return st;
      access(o) = v;
      return absl::OkStatus();
    };
    f.render = [access, name = f.name](const T& o) {
      return RenderValue(name, access(o), access(Defaults()));
    };
    return Add(std::move(f));
  }
  // A std::vector<std::string> field: each time the flag is given appends its value.
  template <typename A>
  FlagSet& List(std::string name, std::string value_name, std::string help, A access) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = [access](T& o, absl::string_view text) {
      access(o).push_back(std::string(text));
      return absl::OkStatus();
    };
    f.render = [access, name = f.name](const T& o) {
      std::vector<std::string> out;
      for (const std::string& v : access(o)) {
        out.push_back("--" + name);
        out.push_back(v);
      }
      return out;
    };
    return Add(std::move(f));
  }
  // Any other flag: `set` parses the value into the options, `render` gives the flags that
  // reproduce them (none: not forwarded).
  FlagSet& Custom(std::string name, std::string value_name, std::string help,
                  std::function<absl::Status(T&, absl::string_view)> set,
                  std::function<std::vector<std::string>(const T&)> render) {
    Flag f = Make(std::move(name), std::move(value_name), std::move(help));
    f.set = std::move(set);
    f.render = std::move(render);
    return Add(std::move(f));
  }
  // A bool field set to `when_given` by the switch.
  template <typename A>
  FlagSet& Switch(std::string name, std::string help, A access, bool when_given = true) {
    Flag f = Make(std::move(name), "", std::move(help));
    f.set = [access, when_given](T& o, absl::string_view) {
      access(o) = when_given;
      return absl::OkStatus();
    };
    f.render = [access, when_given, name = f.name](const T& o) {
      return access(o) == when_given && access(Defaults()) != when_given
                 ? std::vector<std::string>{"--" + name}
                 : std::vector<std::string>{};
    };
    return Add(std::move(f));
  }
  // The field FieldError names for the last flag added, when it is not the flag's name.
  FlagSet& Field(std::string field) {
    flags_.back().field = std::move(field);
    return *this;
  }
  // Two flags that may not both be given.
  FlagSet& Exclusive(std::string a, std::string b) {
    exclusive_.emplace_back(std::move(a), std::move(b));
    return *this;
  }
  // A check of the parsed options as a whole (after every flag): its error should name flags.
  FlagSet& Check(std::function<absl::Status(const T&, const std::set<std::string>& given)> c) {
    checks_.push_back(std::move(c));
    return *this;
  }
  // Every flag (and rule) of `sub`, applied to the member `access` selects; flags named in
  // `except` are left out.
  template <typename U, typename A>
  FlagSet& Include(const FlagSet<U>& sub, A access, const std::set<std::string>& except = {}) {
    for (const typename FlagSet<U>::Flag& s : sub.flags()) {
      if (except.count(s.name) > 0) continue;
      Flag f{s.name, s.value_name, s.help, s.section, s.field, nullptr, nullptr};
      f.set = [access, set = s.set](T& o, absl::string_view text) { return set(access(o), text); };
      f.render = [access, render = s.render](const T& o) { return render(access(o)); };
      Add(std::move(f));
    }
    for (const auto& [a, b] : sub.exclusive()) {
      if (except.count(a) == 0 && except.count(b) == 0) exclusive_.emplace_back(a, b);
    }
    for (const auto& c : sub.checks()) {
      checks_.push_back([access, c](const T& o, const std::set<std::string>& given) {
        return c(access(o), given);
      });
    }
    return *this;
  }

  // Another help text for --name (a flag declared before, or included: its default here).
  FlagSet& Help(const std::string& name, std::string help) {
    for (Flag& f : flags_) {
      if (f.name == name) f.help = std::move(help);
    }
    return *this;
  }

  // -c as another spelling of --name (a flag declared before, or included).
  FlagSet& Short(char c, const std::string& name) {
    shorts_.emplace_back(c, name);
    return *this;
  }

  // Fills `out` (which holds the defaults) from `argv`; returns the names of the flags given.
  // InvalidArgument naming the flag for any error.
  absl::Status Parse(const std::vector<std::string>& argv, T* out,
                     std::set<std::string>* given = nullptr) const {
    std::set<std::string> seen;
    for (size_t i = 0; i < argv.size(); ++i) {
      std::string a = argv[i];
      if (a.size() >= 2 && a[0] == '-' && a[1] != '-' && (a.size() == 2 || a[2] == '=')) {
        const std::string* long_name = ShortName(a[1]);
        if (long_name == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              "unknown flag ", a.substr(0, 2), ShortList().empty() ? "" : " (short flags here: ",
              ShortList(), ShortList().empty() ? "" : ")"));
        }
        a = "--" + *long_name + a.substr(2);  // -x=VALUE: --name=VALUE
      }
      if (a.size() < 3 || a.rfind("--", 0) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected argument \"", a, "\": options are --name VALUE (see --help)"));
      }
      std::string name = a.substr(2);
      std::optional<std::string> value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
      }
      const Flag* f = Find(name);
      if (f == nullptr) {
        const std::string near = Closest(name, Names());
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag --", name,
                         near.empty() ? "" : absl::StrCat(" (did you mean --", near, "?)")));
      }
      if (f->value_name.empty()) {
        if (value.has_value())
          return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      } else if (!value.has_value()) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value (", f->value_name, ")"));
        }
        value = argv[++i];
      }
      if (absl::Status st = f->set(*out, value.value_or("")); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("--", name, ": ", st.message()));
      }
      seen.insert(name);
    }
    for (const auto& [a, b] : exclusive_) {
      if (seen.count(a) > 0 && seen.count(b) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", a, " and --", b, " are exclusive; give one"));
      }
    }
    for (const auto& c : checks_) {
      if (absl::Status st = c(*out, seen); !st.ok()) return Explain(st);
    }
    if (given != nullptr) *given = std::move(seen);
    return absl::OkStatus();
  }

  // The flags (with values) that reproduce `o`'s fields that differ from T{}'s.
  std::vector<std::string> Render(const T& o) const {
    std::vector<std::string> out;
    for (const Flag& f : flags_) {
      for (std::string& s : f.render(o)) out.push_back(std::move(s));
    }
    return out;
  }

  // `status` with the flags that set its FieldError's fields in place of the fields' names.
  absl::Status Explain(const absl::Status& status) const {
    const std::string field = FieldOf(status);
    if (field.empty()) return status;
    const Flag* f = FindField(field);
    if (f == nullptr) return status;
    const std::string what = FillFields(FieldWhat(status), [this](absl::string_view name) {
      const Flag* g = FindField(name);
      return g == nullptr ? std::string(name) : "--" + g->name;
    });
    return absl::Status(status.code(), absl::StrCat("--", f->name, ": ", what));
  }

  // The flags by section, with their value names and help, aligned.
  std::string Help() const {
    std::string out, section = "\x01";
    for (const Flag& f : flags_) {
      if (f.section != section) {
        section = f.section;
        if (!section.empty()) absl::StrAppend(&out, section, ":\n");
      }
      std::string left = absl::StrCat("  ", ShortOf(f.name), "--", f.name,
                                      f.value_name.empty() ? "" : " ", f.value_name);
      if (left.size() < 26) {
        left.resize(26, ' ');
        absl::StrAppend(&out, left, Indent(f.help), "\n");
      } else {
        absl::StrAppend(&out, left, "\n", std::string(26, ' '), Indent(f.help), "\n");
      }
    }
    return out;
  }

  const std::vector<Flag>& flags() const { return flags_; }
  const std::vector<std::pair<std::string, std::string>>& exclusive() const { return exclusive_; }
  const std::vector<std::function<absl::Status(const T&, const std::set<std::string>&)>>& checks()
      const {
    return checks_;
  }

 private:
  static const T& Defaults() {
    static const T defaults{};
    return defaults;
  }
  Flag Make(std::string name, std::string value_name, std::string help) {
    Flag f;
    f.field = name;
    for (char& c : f.field) c = c == '-' ? '_' : c;
    f.name = std::move(name);
    f.value_name = std::move(value_name);
    f.help = std::move(help);
    f.section = section_;
    return f;
  }
  FlagSet& Add(Flag f) {
    flags_.push_back(std::move(f));
    return *this;
  }
  const Flag* Find(absl::string_view name) const {
    for (const Flag& f : flags_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
  const Flag* FindField(absl::string_view field) const {
    for (const Flag& f : flags_) {
      if (f.field == field) return &f;
    }
    return nullptr;
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> n;
    for (const Flag& f : flags_) n.push_back(f.name);
    return n;
  }
  static std::string Join(const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ", ", v[i]);
    return out;
  }
  static std::string Indent(const std::string& help) {
    std::string out;
    for (char c : help) {
      out += c;
      if (c == '\n') out += std::string(26, ' ');
    }
    return out;
  }

  // A range bound (a double) as an integer of V's range, saturating.
  template <typename V>
  static int64_t ToInt(double bound) {
    constexpr int64_t kMin =
        std::is_signed_v<V> ? static_cast<int64_t>(std::numeric_limits<V>::min()) : 0;
    constexpr int64_t kMax = sizeof(V) >= sizeof(int64_t)
                                 ? std::numeric_limits<int64_t>::max()
                                 : static_cast<int64_t>(std::numeric_limits<V>::max());
    if (!(bound > static_cast<double>(kMin))) return kMin;
    if (!(bound < static_cast<double>(kMax))) return kMax;
    return static_cast<int64_t>(bound);
  }
  // Parsing and rendering by field type.
  template <typename V>
  static absl::Status Assign(V& field, absl::string_view text, double lo, double hi) {
    if constexpr (std::is_same_v<V, std::string>) {
      // An empty value is refused rather than taken as the default, or as "none": an unset
      // shell variable (--api-keys "$KEYS") turned off what the flag asks for.
      if (text.empty()) return absl::InvalidArgumentError(kEmptyValue);
      field = std::string(text);
      return absl::OkStatus();
    } else if constexpr (std::is_same_v<V, std::vector<int>>) {
      return ParseIntList(text, static_cast<int64_t>(lo < -2e9 ? -2e9 : lo),
                          static_cast<int64_t>(hi > 2e9 ? 2e9 : hi), &field);
    } else if constexpr (std::is_integral_v<V>) {
      int64_t v = 0;
      if (absl::Status st = ParseInt(text, ToInt<V>(lo), ToInt<V>(hi), &v); !st.ok()) return st;
      field = static_cast<V>(v);
      return absl::OkStatus();
    } else if constexpr (std::is_floating_point_v<V>) {
      double v = 0;
      if (absl::Status st = ParseDouble(text, lo, hi, &v); !st.ok()) return st;
      field = static_cast<V>(v);
      return absl::OkStatus();
    } else {
      typename V::value_type inner{};
      if (absl::Status st = Assign(inner, text, lo, hi); !st.ok()) return st;
      field = std::move(inner);
      return absl::OkStatus();
    }
  }
  template <typename V>
  static std::string Format(const V& v) {
    if constexpr (std::is_same_v<V, std::string>) {
      return v;
    } else if constexpr (std::is_same_v<V, std::vector<int>>) {
      std::string out;
      for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : ",", v[i]);
      return out;
    } else if constexpr (std::is_floating_point_v<V>) {
      return FormatDouble(static_cast<double>(v));
    } else {
      return absl::StrCat(v);
    }
  }
  template <typename V>
  static std::vector<std::string> RenderValue(const std::string& name, const V& v, const V& def) {
    if (v == def) return {};
    if constexpr (IsOptional<V>::value) {
      if (!v.has_value()) return {};
      return {"--" + name, Format(*v)};
    } else {
      return {"--" + name, Format(v)};
    }
  }

  std::string section_;
  const std::string* ShortName(char c) const {
    for (const auto& [s, name] : shorts_) {
      if (s == c) return &name;
    }
    return nullptr;
  }
  std::string ShortOf(const std::string& name) const {
    for (const auto& [s, n] : shorts_) {
      if (n == name) return absl::StrCat("-", std::string(1, s), ", ");
    }
    return "";
  }
  std::string ShortList() const {
    std::string out;
    for (const auto& [s, n] : shorts_)
      absl::StrAppend(&out, out.empty() ? "" : " ", "-", std::string(1, s));
    return out;
  }

  std::vector<Flag> flags_;
  std::vector<std::pair<char, std::string>> shorts_;
  std::vector<std::pair<std::string, std::string>> exclusive_;
  std::vector<std::function<absl::Status(const T&, const std::set<std::string>&)>> checks_;
};

}  // namespace recall::flags
