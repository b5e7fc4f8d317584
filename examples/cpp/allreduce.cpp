// Sums a vector over every rank, then gathers each rank's count, with jaccl's C interface
// from C++ (a small RAII owner and an exception per error).
//
//   scripts/install-c.sh                      # once: libjaccl, jaccl.h, jaccl.pc, the jaccl command
//   c++ allreduce.cpp $(pkg-config --cflags --libs jaccl) -o allreduce
//   jaccl launch -n 4 ./allreduce
#include <jaccl.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Throws the communicator's last error (rank, operation, cause) if `r` is not success.
void check(jaccl_result_t r, jaccl_comm_t *comm) {
  if (r != JACCL_SUCCESS)
    throw std::runtime_error(std::string(jaccl_get_error_string(r)) + ": " +
                             jaccl_comm_get_last_error(comm));
}

struct Destroy {
  void operator()(jaccl_comm_t *comm) const { jaccl_comm_destroy(comm); }
};
using Comm = std::unique_ptr<jaccl_comm_t, Destroy>;

}  // namespace

int main() {
  try {
    jaccl_comm_t *raw = nullptr;
    check(jaccl_comm_init_env(&raw), nullptr);
    Comm comm(raw);
    int rank = 0, size = 1;
    check(jaccl_comm_rank(comm.get(), &rank), comm.get());
    check(jaccl_comm_size(comm.get(), &size), comm.get());

    std::vector<double> data(1000);
    std::iota(data.begin(), data.end(), double(rank));  // rank, rank+1, ...
    std::vector<double> sum(data.size());
    check(jaccl_all_reduce(data.data(), sum.data(), data.size(), JACCL_FLOAT64, JACCL_SUM,
                           comm.get()),
          comm.get());

    // Every rank's count of elements, gathered on every rank.
    std::int64_t mine = std::int64_t(data.size());
    std::vector<std::int64_t> counts(static_cast<size_t>(size));
    check(jaccl_all_gather(&mine, counts.data(), 1, JACCL_INT64, comm.get()), comm.get());

    // sum[i] = sum over ranks of (rank + i) = size*(size-1)/2 + size*i.
    bool ok = std::accumulate(counts.begin(), counts.end(), std::int64_t(0)) ==
              std::int64_t(size) * std::int64_t(data.size());
    for (std::size_t i = 0; i < sum.size(); i++)
      ok = ok && sum[i] == size * (size - 1) / 2.0 + double(size) * double(i);
    if (rank == 0)
      std::printf("all_reduce and all_gather on %d ranks from C++: %s\n", size, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
