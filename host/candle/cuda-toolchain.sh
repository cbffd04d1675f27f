# Source this to build flashattn-candle with candle's `cuda` feature on a machine without a
# CUDA toolkit (and without a GPU): CUDA 13.0's compiler and link-time libraries from PyPI.
#
#   source host/candle/cuda-toolchain.sh [DIR]    (DIR: where the wheels go; default ~/.cache/flashattn-cuda)
#   cargo test --release -p flashattn-candle --features cuda --no-run
#
# candle compiles its own kernels with nvcc and links cuBLAS, cuRAND and the CUDA runtime;
# flashattn's kernels need none of it. At run time the binary needs the driver and those
# libraries (on a machine with PyTorch: its nvidia-* wheels, see .ci/gpu-bundle's run.sh).
# Compute capability 9.0 (H100/H200) unless CUDA_COMPUTE_CAP says otherwise.

_fa_cuda_setup() {
    local dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/flashattn-cuda}
    local cu=$dir/nvidia/cu13
    # One pip call: a later `--target` install into the same tree is skipped. Versions kept
    # together: a newer nvvm than nvcc writes PTX a 13.0 driver cannot load.
    if [ ! -x "$cu/bin/nvcc" ] || [ ! -e "$cu/lib/libcublas.so.13" ]; then
        rm -rf "$dir"
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" \
            nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
            nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
            nvidia-curand==10.4.0.35 nvidia-cublas==13.0.0.19 || return 1
    fi
    # The wheels have only versioned names; the linker asks for the plain ones.
    local l
    for l in cudart:13 cublas:13 cublasLt:13 curand:10 nvrtc:13; do
        ln -sfn "lib${l%%:*}.so.${l##*:}" "$cu/lib/lib${l%%:*}.so"
    done
    # Without a driver here, a stub libcuda (soname libcuda.so.1; the driver's own at run time)
    # with every entry point cudarc declares, where cudarc's link search looks.
    if [ ! -e "$cu/lib/stubs/libcuda.so" ]; then
        local cudarc
        cudarc=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* 2>/dev/null | sort -V | tail -1)
        [ -n "$cudarc" ] || { cargo fetch -q && cudarc=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* | sort -V | tail -1); } || return 1
        mkdir -p "$cu/lib/stubs"
        grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$cudarc/src/driver/sys/mod.rs" | awk '{print $4}' | sort -u |
            sed 's/.*/int &(void) { return 999; }/' > "$cu/lib/stubs/cuda_stub.c"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cu/lib/stubs/libcuda.so" "$cu/lib/stubs/cuda_stub.c" || return 1
    fi
    # Its soname too, so that a test binary starts here with the stubs on LD_LIBRARY_PATH
    # (CI: every CUDA call then fails, the GPU tests skip); never on a GPU machine's path.
    ln -sfn libcuda.so "$cu/lib/stubs/libcuda.so.1"
    export PATH="$cu/bin:$PATH" NVCC="$cu/bin/nvcc" CUDA_HOME="$cu"
    export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
    unset CUDA_PATH CUDA_ROOT CUDA_TOOLKIT_ROOT_DIR CUDNN_LIB NVCC_CCBIN CUDARC_CUDA_VERSION
    echo "CUDA 13.0 from PyPI in $cu (compute capability $CUDA_COMPUTE_CAP)"
}
_fa_cuda_setup "$@"
