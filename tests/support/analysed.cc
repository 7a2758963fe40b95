// SPDX-License-Identifier: MIT
// analysed-cxx: an uncaught C++ exception (std::terminate -> abort), thrown from thrower().
#include <stdexcept>

namespace app {
__attribute__((noinline)) void thrower(int depth) {
        if (depth == 0)
                throw std::runtime_error("boom");
        thrower(depth - 1);
}
}  // namespace app

int main() {
        app::thrower(3);
        return 0;
}
