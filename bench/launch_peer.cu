// Host cost of one kernel launch from CUDA C++ on this host: the peer of `kgen bench`'s
// launch-cost line (same method: 400 launches of a 1-block relu over 1024 f32, queued
// behind a ~15 ms spin kernel so the GPU never catches up and the launch queue never
// makes the host wait; median of 9 rounds; the kinds interleaved round by round).
// bench/launch_peers.py compiles it with nvcc when nvcc is on PATH and reads its output:
// one JSON record per line, in torch_peers.py's record format.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void relu(const float* x, float* y, int n) {
  int i = threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f);
}

__global__ void spin(long long cycles) {
  long long t = clock64();
  while (clock64() - t < cycles) {
  }
}

static double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

int main() {
  const int launches = 400, rounds = 9, n = 1024;
  float *x = nullptr, *y = nullptr;
  if (cudaMalloc(&x, n * 4) != cudaSuccess || cudaMalloc(&y, n * 4) != cudaSuccess) {
    fprintf(stderr, "launch_peer: cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(x, 0x3f, n * 4);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaFunction_t rf;
  cudaGetFuncBySymbol(&rf, (const void*)relu);
  CUfunction cf = (CUfunction)rf;
  int nn = n;
  void* args[] = {&x, &y, &nn};
  const char* peers[] = {"cuda_cpp_triple_chevron", "cuda_cpp_cudaLaunchKernel",
                         "cuda_cpp_cuLaunchKernel"};
  const char* what[] = {"CUDA C++ relu<<<1, 1024, 0, stream>>>(...)",
                        "CUDA C++ cudaLaunchKernel(...)",
                        "CUDA C++ driver cuLaunchKernel(...)"};
  for (int i = 0; i < 20; i++) relu<<<1, 1024, 0, s>>>(x, y, n);
  cudaDeviceSynchronize();
  std::vector<double> t[3];
  for (int r = 0; r < rounds; r++) {
    for (int v = 0; v < 3; v++) {
      cudaDeviceSynchronize();
      spin<<<1, 1, 0, s>>>(30000000LL);
      double t0 = now_us();
      for (int i = 0; i < launches; i++) {
        if (v == 0) {
          relu<<<1, 1024, 0, s>>>(x, y, n);
        } else if (v == 1) {
          cudaLaunchKernel((const void*)relu, dim3(1), dim3(1024), args, 0, s);
        } else {
          cuLaunchKernel(cf, 1, 1, 1, 1024, 1, 1, 0, (CUstream)s, args, nullptr);
        }
      }
      t[v].push_back((now_us() - t0) / launches);
      cudaDeviceSynchronize();
    }
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    fprintf(stderr, "launch_peer: %s\n", cudaGetErrorString(e));
    return 1;
  }
  for (int v = 0; v < 3; v++) {
    std::sort(t[v].begin(), t[v].end());
    printf("{\"workload\": \"launch_host\", \"peer\": \"%s\", \"what\": \"%s\", "
           "\"median_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f}\n",
           peers[v], what[v], t[v][rounds / 2], t[v][0], t[v][rounds - 1]);
  }
  return 0;
}
