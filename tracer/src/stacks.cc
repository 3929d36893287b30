#include "megascope/tracer/stacks.h"

#include "megascope/tracer/format.h"

#define UNW_LOCAL_ONLY
#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <libunwind.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "megascope/tracer/file_util.h"

namespace megascope::tracer {
namespace {

constexpr int kMaxFrames = 128;

// The one thread asked at a time. `armed` holds the tid that may take the slot; its handler swaps
// it for -1 (taken), fills ips, then sets `done`. Static storage: a handler that runs after the
// caller gave up on it writes nowhere that has been freed.
struct Slot {
  std::atomic<int> armed{0};
  std::atomic<int> done{0};
  int max = 0;
  int n = 0;
  void* ips[kMaxFrames];
};
Slot g_slot;

int Tid() { return static_cast<int>(::syscall(SYS_gettid)); }

void OnStackSignal(int, siginfo_t*, void* uctx) {
  const int saved_errno = errno;
  int me = Tid();
  if (g_slot.armed.compare_exchange_strong(me, -1)) {
    unw_cursor_t cursor;
    int n = 0;
    // From the interrupted frame (the signal's context), not from this handler.
    if (unw_init_local2(&cursor, static_cast<unw_context_t*>(uctx), UNW_INIT_SIGNAL_FRAME) == 0) {
      do {
        // Frames above a signal trampoline belong to a handler the thread was in (the dump
        // request's, say): what it was doing starts below it.
        if (unw_is_signal_frame(&cursor) > 0) {
          n = 0;
          continue;
        }
        unw_word_t ip = 0;
        if (unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0 || ip == 0) break;
        g_slot.ips[n++] = reinterpret_cast<void*>(ip);  // NOLINT(performance-no-int-to-ptr): an IP
      } while (n < g_slot.max && unw_step(&cursor) > 0);
    }
    g_slot.n = n;
    g_slot.done.store(1, std::memory_order_release);
  }
  errno = saved_errno;
}

int StackSignal() { return SIGRTMIN + 5; }

std::once_flag g_installed;
std::mutex g_capture;  // one capture at a time

// Function symbols of one ELF file (its .symtab, which holds the functions of anonymous
// namespaces too; else its .dynsym), sorted by address relative to the load base.
struct Symbols {
  struct Sym {
    uint64_t at, size;
    std::string name;
  };
  std::vector<Sym> syms;
  bool relative = true;  // a shared object or PIE: addresses are offsets from the load base

  static Symbols Load(const std::string& path) {
    Symbols out;
    auto file = ReadFile(path);
    if (!file.ok() || file->size() < sizeof(Elf64_Ehdr)) return out;
    const std::string& f = *file;
    Elf64_Ehdr eh;
    std::memcpy(&eh, f.data(), sizeof(eh));
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > f.size()) {
      return out;
    }
    out.relative = eh.e_type == ET_DYN;
    auto section = [&](size_t i) {
      Elf64_Shdr sh;
      std::memcpy(&sh, f.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
      return sh;
    };
    for (uint32_t want : {uint32_t{SHT_SYMTAB}, uint32_t{SHT_DYNSYM}}) {
      for (size_t i = 0; i < eh.e_shnum; ++i) {
        const Elf64_Shdr sh = section(i);
        if (sh.sh_type != want || sh.sh_link >= eh.e_shnum) continue;
        const Elf64_Shdr str = section(sh.sh_link);
        if (sh.sh_offset + sh.sh_size > f.size() || str.sh_offset + str.sh_size > f.size())
          continue;
        for (uint64_t k = 0; k + sizeof(Elf64_Sym) <= sh.sh_size; k += sizeof(Elf64_Sym)) {
          Elf64_Sym sym;
          std::memcpy(&sym, f.data() + sh.sh_offset + k, sizeof(sym));
          if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 ||
              sym.st_name >= str.sh_size) {
            continue;
          }
          const char* name = f.data() + str.sh_offset + sym.st_name;
          out.syms.push_back({sym.st_value, sym.st_size,
                              std::string(name, strnlen(name, str.sh_size - sym.st_name))});
        }
      }
      if (!out.syms.empty()) break;
    }
    std::sort(out.syms.begin(), out.syms.end(),
              [](const Sym& a, const Sym& b) { return a.at < b.at; });
    return out;
  }

  const Sym* Find(uint64_t at) const {
    auto it = std::upper_bound(syms.begin(), syms.end(), at,
                               [](uint64_t v, const Sym& s) { return v < s.at; });
    if (it == syms.begin()) return nullptr;
    --it;
    return at < it->at + std::max<uint64_t>(it->size, 1) ? &*it : nullptr;
  }
};

std::string Symbolize(void* ip, bool innermost, std::map<std::string, Symbols>* cache) {
  // A return address points after the call; look up the call itself.
  const auto at = reinterpret_cast<uintptr_t>(ip) - (innermost ? 0 : 1);
  std::string buf;
  Dl_info info{};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an instruction address
  if (::dladdr(reinterpret_cast<void*>(at), &info) == 0 || info.dli_fname == nullptr) {
    buf = Format("0x%lx", static_cast<unsigned long>(at));
    return buf;
  }
  std::string path = info.dli_fname;
  if (path.empty() || path.find('/') == std::string::npos) path = "/proc/self/exe";
  auto it = cache->find(path);
  if (it == cache->end()) it = cache->emplace(path, Symbols::Load(path)).first;
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  const uint64_t rel = it->second.relative ? at - base : at;
  std::string module = info.dli_fname;
  module = module.substr(module.rfind('/') + 1);
  if (const Symbols::Sym* s = it->second.Find(rel)) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(s->name.c_str(), nullptr, nullptr, &status);
    std::string fn = status == 0 && demangled ? demangled : s->name;
    std::free(demangled);
    buf = Format("+0x%lx", static_cast<unsigned long>(rel - s->at + (innermost ? 0 : 1)));
    return fn + buf + " (" + module + ")";
  }
  buf = Format("??+0x%lx", static_cast<unsigned long>(at - base));
  return buf + std::string(" (") + module + ")";
}

std::vector<int> Threads() {
  std::vector<int> tids;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') tids.push_back(std::atoi(e->d_name));
    }
    ::closedir(d);
  }
  std::sort(tids.begin(), tids.end());
  return tids;
}

}  // namespace

std::vector<ThreadStack> CaptureThreadStacks(std::chrono::milliseconds per_thread, int max_frames) {
  std::lock_guard<std::mutex> lock(g_capture);
  std::call_once(g_installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &OnStackSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    ::sigaction(StackSignal(), &sa, nullptr);
  });
  const int self = Tid();
  std::vector<ThreadStack> out;
  std::map<std::string, Symbols> symbols;  // per module, loaded once per capture
  for (int tid : Threads()) {
    if (tid == self) continue;
    ThreadStack t;
    t.tid = tid;
    if (auto comm = ReadFile("/proc/self/task/" + std::to_string(tid) + "/comm"); comm.ok()) {
      t.name = *comm;
      while (!t.name.empty() && t.name.back() == '\n') t.name.pop_back();
    }
    g_slot.max = std::clamp(max_frames, 1, kMaxFrames);
    g_slot.n = 0;
    g_slot.done.store(0);
    g_slot.armed.store(tid);
    if (::syscall(SYS_tgkill, ::getpid(), tid, StackSignal()) != 0) {
      g_slot.armed.store(0);
      continue;  // the thread has exited since it was listed
    }
    const auto deadline = std::chrono::steady_clock::now() + per_thread;
    bool answered = false;
    for (;;) {
      if (g_slot.done.load(std::memory_order_acquire)) {
        answered = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        int expect = tid;
        if (g_slot.armed.compare_exchange_strong(expect, 0)) break;  // never taken: give up
        // Taken just now: the handler is unwinding and will finish shortly.
      }
      const timespec pause{0, 200'000};
      ::nanosleep(&pause, nullptr);
    }
    if (answered) {
      for (int i = 0; i < g_slot.n; ++i)
        t.frames.push_back(Symbolize(g_slot.ips[i], i == 0, &symbols));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string FrameFunction(const std::string& frame) {
  // "name+0x1c (module)": the name may hold parentheses and spaces of its own; the offset ends it.
  const size_t plus = frame.rfind("+0x");
  if (plus != std::string::npos && plus > 0) return frame.substr(0, plus);
  return frame.substr(0, frame.rfind(" ("));
}

}  // namespace megascope::tracer
