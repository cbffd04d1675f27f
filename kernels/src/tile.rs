//! Every tile decision, in one pure function per kernel family, used by the kernels (as
//! const generics of their entry points) and by the host (grid, block, shared memory).

/// A tile as a type: how a kernel variant's tile reaches its kernel whole (FA2's
/// `Kernel_traits`). The registry declares one per variant, holding the tile its family's
/// tile function gives (`registry::config!`); the kernel takes it as a type parameter `C` and
/// the tile's fields and derived counts as const parameters, checked against `C::TILE` at
/// compile time (`const { assert!(..) }`). Stable Rust cannot size arrays from `C::TILE`
/// inside a generic function or pass it on as a const argument, so the registry computes
/// those parameters from the tile. The flags that choose code paths (q_in_regs, padded,
/// fused_exp, split, ...) stay const parameters too: read from `C::TILE` in the body, the
/// same kernels came out with other registers (ptxas 13.0, sm_80: mma forward d=128 padded
/// 242 -> 248, d=256 241 -> 244).
pub trait Config {
    type Tile: Copy;
    const TILE: Self::Tile;
}

/// Warps per block of the SIMT forward kernel.
pub const SIMT_WARPS: u32 = 4;

/// Tile shape of the SIMT forward kernel.
///
/// Each warp owns `rows_per_warp` query rows; lane `l` owns score columns `l + 32*i`
/// (`i < s_cols`) and output columns `l + 32*j` (`j < d_chunks`), so the softmax
/// statistics (m_i, l_i) and acc_o stay in registers and no cross-warp reduction is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimtTile {
    /// Query rows per warp.
    pub rows_per_warp: u32,
    /// Output columns per lane, in chunks of 32: the largest head_dim served is 32 * d_chunks.
    pub d_chunks: u32,
    /// Score columns per lane, in chunks of 32: bc = 32 * s_cols.
    pub s_cols: u32,
}

impl SimtTile {
    /// Query rows per block (Br).
    pub const fn br(&self) -> u32 {
        self.rows_per_warp * SIMT_WARPS
    }
    /// Key/value rows per tile (Bc).
    pub const fn bc(&self) -> u32 {
        self.s_cols * 32
    }
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        SIMT_WARPS * 32
    }
    /// Largest head_dim this tile serves.
    pub const fn max_head_dim(&self) -> u32 {
        self.d_chunks * 32
    }
    /// Row stride (in f32) of the K tile: padded by one so the lanes of a warp, reading one
    /// column of 32 different K rows, hit 32 different banks.
    pub const fn k_stride(head_dim: u32) -> u32 {
        head_dim + 1
    }
    /// Shared memory, in f32 elements: Q [br][d], K [bc][d+1], V [bc][d], P [br][bc].
    pub const fn smem_floats(&self, head_dim: u32) -> u32 {
        self.br() * head_dim + self.bc() * Self::k_stride(head_dim) + self.bc() * head_dim + self.br() * self.bc()
    }
    /// Shared memory per block, in bytes.
    pub const fn smem_bytes(&self, head_dim: u32) -> u32 {
        self.smem_floats(head_dim) * 4
    }
}

/// The SIMT forward tile for `head_dim` (1..=256).
///
/// Reasons: acc_o is rows_per_warp * d_chunks registers per thread; keeping it at 64 or less
/// leaves room for the scores and statistics: ptxas -v (sm_90, commit 8f51bfb) reports 168,
/// 224 and 156 registers for the three tiles, no spills, no stack. Shared memory stays under
/// 110 KB so it fits sm_80 (163 KB). Measured on an H200 (2026-11-29, 8f51bfb, FA paper
/// shapes): about 11 TFLOP/s at d=64 and 7.5 at d=128; this kernel is the correct baseline,
/// not the fast path.
pub const fn simt_tile(head_dim: u32) -> SimtTile {
    if head_dim <= 64 {
        // acc 16x2, scores 16x2; smem 72 KB at d=64.
        SimtTile { rows_per_warp: 16, d_chunks: 2, s_cols: 2 }
    } else if head_dim <= 128 {
        // acc 16x4, scores 16x1; smem 73 KB at d=128.
        SimtTile { rows_per_warp: 16, d_chunks: 4, s_cols: 1 }
    } else {
        // acc 8x8, scores 8x1; smem 101 KB at d=256.
        SimtTile { rows_per_warp: 8, d_chunks: 8, s_cols: 1 }
    }
}

/// Warps per block of the tensor-core (mma) forward kernel.
pub const MMA_WARPS: u32 = 4;

/// Tile shape of the tensor-core forward kernel: each warp owns `m_tiles` m16 tiles of query
/// rows (Br = 64 * m_tiles for 4 warps), K/V tiles of Bc keys, double-buffered in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaTile {
    /// m16 tiles of query rows per warp.
    pub m_tiles: u32,
    /// Keys per K/V tile.
    pub bc: u32,
    /// Whether the warp keeps its Q fragments in registers for the whole KV loop (else it
    /// reloads them from shared memory at every tile).
    pub q_in_regs: bool,
    /// The head_dim this tile is compiled for.
    pub head_dim: u32,
    /// Whether the kernel takes any head_dim up to `head_dim` (zero-padded), at the cost of
    /// a few registers, or exactly `head_dim`.
    pub padded: bool,
    /// Softmax on raw scores, P = 2^(S c - m c) as one FFMA per score (FA2's form), or on
    /// scores scaled first (an FMUL and an FADD per score).
    pub fused_exp: bool,
}

impl MmaTile {
    /// Query rows per block.
    pub const fn br(&self) -> u32 {
        self.m_tiles * 16 * MMA_WARPS
    }
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        MMA_WARPS * 32
    }
    /// Elements per shared-memory row: head_dim when it is a multiple of 64 (the rows are
    /// XOR-swizzled), else head_dim plus one 16-byte chunk of padding.
    pub const fn row_stride(&self) -> u32 {
        if self.head_dim.is_multiple_of(64) { self.head_dim } else { self.head_dim + 8 }
    }
    /// Shared memory per block, in bytes: Q [br] rows and two stages of K, V [bc] rows, 16-bit;
    /// 16 bytes of flags (`fwd_mma`).
    pub const fn smem_bytes(&self) -> u32 {
        (self.br() + 4 * self.bc) * self.row_stride() * 2 + 16
    }
}

/// The tensor-core forward tile for `head_dim`, if there is one (f16 and bf16).
///
/// Chosen (ptxas 13.0, no spills; speeds in benches/RESULTS.md):
/// - d=64: two m16 tiles per warp (Br = 128, FA2's block rows), Bc = 64, Q reloaded per
///   k-step: each K/V fragment feeds four mma.
/// - d=128: two m16 tiles, Bc = 32: 251 registers once the cp.async addresses are rebuilt per
///   tile and shared addresses kept in 32 bits (`thread::opaque`, 2f46583).
/// - 32, 96, 192, 256: the largest tile ptxas fits in 255 registers: d=32 two m-tiles with Q
///   in registers, d=96 one m-tile with Q in registers, d=192 and 256 one m-tile, Bc = 32, Q
///   reloaded.
/// - Every other head_dim: the next larger tile, zero-padded (`padded`; not a multiple of 8:
///   element by element, `copy`); d=33..63 and 97..127 one m-tile with Q in registers.
///
/// Rejected:
/// - One m16 tile per warp, Q in registers (38ad60d): a fragment feeds two mma, twice FA2's
///   shared-memory traffic per FLOP; at d=128 (`mma_br64`) 256 / 283 TFLOP/s at s = 1k / 16k
///   against 305 / 351 (2f46583).
/// - d=128, Bc = 64 (FA2's Hopper tile): spills 284-460 bytes.
pub const fn mma_tile(head_dim: u32) -> Option<MmaTile> {
    const fn t(m_tiles: u32, bc: u32, q_in_regs: bool, head_dim: u32, padded: bool) -> Option<MmaTile> {
        Some(MmaTile { m_tiles, bc, q_in_regs, head_dim, padded, fused_exp: true })
    }
    match mma_head_dim(head_dim) {
        Some(32) => t(2, 64, true, 32, true),
        Some(64) if head_dim == 64 => t(2, 64, false, 64, false),
        Some(64) => t(1, 64, true, 64, true),
        Some(96) => t(1, 64, true, 96, true),
        Some(128) if head_dim == 128 => t(2, 32, false, 128, false),
        Some(128) => t(1, 64, true, 128, true),
        Some(192) => t(1, 32, false, 192, true),
        Some(256) => t(1, 32, false, 256, true),
        _ => None,
    }
}

/// The body [`mma_tile`]'s entry `entry` (`crate::ENTRY_*`) runs: the general one for the
/// window entry at head_dim 128 exactly, where the window-only body spills 4 bytes on sm_80
/// (ptxas 13.0; the general body, with the softcap's and ALiBi's code, does not); else its
/// own.
pub const fn mma_entry(head_dim: u32, entry: u8) -> u8 {
    match mma_tile(head_dim) {
        Some(t) if t.head_dim == 128 && !t.padded && entry == crate::ENTRY_WINDOW => crate::ENTRY_GENERAL,
        _ => entry,
    }
}

/// The head_dim the tensor-core kernel is compiled for that serves `head_dim` (zero-padded
/// up to it): 32, 64, 96, 128, 192 or 256.
pub const fn mma_head_dim(head_dim: u32) -> Option<u32> {
    match head_dim {
        1..=32 => Some(32),
        33..=64 => Some(64),
        65..=96 => Some(96),
        97..=128 => Some(128),
        129..=192 => Some(192),
        193..=256 => Some(256),
        _ => None,
    }
}

/// The first tensor-core tile (one m16 tile per warp, Bc = 64, Q in registers), kept as the
/// `mma_br64` family for comparison.
pub const fn mma_tile_br64(head_dim: u32) -> Option<MmaTile> {
    match head_dim {
        64 | 128 => Some(MmaTile { m_tiles: 1, bc: 64, q_in_regs: true, head_dim, padded: false, fused_exp: true }),
        _ => None,
    }
}

/// [`mma_tile`] with the softmax on scaled scores (`fused_exp: false`), for comparison
/// (family `mma_unfused`), at head_dim 64 only: at 128 the kernel with the non-finite
/// fix-up call (`nonfinite::warp_fix_stored_o`) spills 4 bytes.
pub const fn mma_tile_unfused(head_dim: u32) -> Option<MmaTile> {
    if head_dim != 64 {
        return None;
    }
    match mma_tile(head_dim) {
        Some(t) => Some(MmaTile { fused_exp: false, ..t }),
        None => None,
    }
}

/// Tile of the SIMT dK/dV backward kernel: each warp owns `keys_per_warp` key rows, each lane
/// one query row of a 32-row query tile (for S, P, dP, dS) and output columns l + 32j of dK
/// and dV (`d_chunks` of them), so the accumulators stay in registers: 2 * keys_per_warp *
/// d_chunks = 64 per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimtKvTile {
    /// Key rows per warp.
    pub keys_per_warp: u32,
    /// Output columns per lane, in chunks of 32.
    pub d_chunks: u32,
}

impl SimtKvTile {
    /// Query rows per inner tile: one per lane.
    pub const BM: u32 = 32;
    /// Key rows per block.
    pub const fn bn(&self) -> u32 {
        self.keys_per_warp * SIMT_WARPS
    }
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        SIMT_WARPS * 32
    }
    /// Shared memory in f32: K, V [bn][d+1], Q, dO [32][d+1], m, 1/l, D - c, c [32], P, dS [bn][32].
    pub const fn smem_floats(&self, head_dim: u32) -> u32 {
        2 * self.bn() * (head_dim + 1) + 2 * Self::BM * (head_dim + 1) + 4 * Self::BM + 2 * self.bn() * Self::BM
    }
    /// Shared memory per block, in bytes.
    pub const fn smem_bytes(&self, head_dim: u32) -> u32 {
        self.smem_floats(head_dim) * 4
    }
}

/// The dK/dV backward tile for `head_dim` (correctness first: not yet timed).
pub const fn simt_kv_tile(head_dim: u32) -> SimtKvTile {
    if head_dim <= 64 {
        SimtKvTile { keys_per_warp: 16, d_chunks: 2 }
    } else if head_dim <= 128 {
        SimtKvTile { keys_per_warp: 8, d_chunks: 4 }
    } else {
        SimtKvTile { keys_per_warp: 4, d_chunks: 8 }
    }
}

/// Tile of the SIMT dQ backward kernel: the forward's, except at head_dim <= 64.
pub const fn simt_dq_tile(head_dim: u32) -> SimtTile {
    if head_dim <= 64 {
        // acc 16x2, scores 16x1. Rejected: the forward's 16x2 scores, at 247-255 registers,
        // spilled 12 bytes once dO and dQ had strides of their own (ptxas 13.0, sm_80).
        SimtTile { rows_per_warp: 16, d_chunks: 2, s_cols: 1 }
    } else if head_dim <= 128 {
        // acc 8x4, scores 8x1. Rejected: the forward's 16x4 spilled 12 bytes at sm_90 with
        // the per-tensor strides.
        SimtTile { rows_per_warp: 8, d_chunks: 4, s_cols: 1 }
    } else {
        simt_tile(head_dim)
    }
}

/// Shared memory (f32) of the SIMT dQ kernel: Q, dO [br][d], K, V [bc][d+1], dS [br][bc] and
/// the rows' m, 1/l, D - c, c [br] (see `bwd_simt`).
pub const fn simt_dq_smem_bytes(head_dim: u32) -> u32 {
    let t = simt_dq_tile(head_dim);
    (2 * t.br() * head_dim + 2 * t.bc() * SimtTile::k_stride(head_dim) + t.br() * t.bc() + 4 * t.br()) * 4
}

/// Tile of the tensor-core backward kernels (f16, bf16), 4 slices of 16 rows each, one warp
/// per slice or (`split` = 2) two that share it, each owning half of D's columns: the dQ
/// kernel's blocks own 64 query rows and loop over K/V tiles of `dq_bc` keys; the dK/dV
/// kernel's blocks own 64 keys and loop over query tiles of `kv_br` rows. Both double-buffer
/// the streamed tiles with cp.async.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaBwdTile {
    /// The head_dim the kernels are compiled for (smaller ones are zero-padded).
    pub head_dim: u32,
    /// Keys per K/V tile of the dQ kernel.
    pub dq_bc: u32,
    /// Whether the dQ kernel keeps each warp's Q and dO fragments in registers (else it
    /// re-reads them from shared memory at every key tile).
    pub dq_q_in_regs: bool,
    /// Query rows per Q/dO tile of the dK/dV kernel.
    pub kv_br: u32,
    /// Whether the dK/dV kernel keeps each warp's K and V fragments in registers (else it
    /// re-reads them from shared memory at every query tile).
    pub kv_in_regs: bool,
    /// Warps per 16-row slice: 1, or 2 that split D in halves (`bwd_mma::slice_and_half`) and
    /// sum their partial S and dP through shared memory (`frag::pair_sum`).
    pub split: u32,
}

impl MmaBwdTile {
    /// Rows per block: query rows (dQ) or keys (dK/dV).
    pub const ROWS: u32 = 16 * MMA_WARPS;
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        MMA_WARPS * 32 * self.split
    }
    /// Elements per shared-memory row (as [`MmaTile::row_stride`]).
    pub const fn row_stride(&self) -> u32 {
        if self.head_dim.is_multiple_of(64) { self.head_dim } else { self.head_dim + 8 }
    }
    /// Bytes of the S / dP exchange of a split tile over `cols` columns of S
    /// (`bwd_mma::exchange_floats`): 0 unsplit.
    const fn exchange_bytes(&self, cols: u32) -> u32 {
        exchange_floats(self.split as usize, cols as usize) as u32 * 4
    }
    /// dQ kernel's shared memory in bytes: Q, dO [64] rows and two stages of K, V [dq_bc]
    /// rows, 16-bit; with `split`, the S / dP exchange.
    pub const fn dq_smem_bytes(&self) -> u32 {
        (2 * Self::ROWS + 4 * self.dq_bc) * self.row_stride() * 2 + self.exchange_bytes(self.dq_bc)
    }
    /// dK/dV kernel's shared memory in bytes: K, V [64] rows and two stages of Q, dO [br]
    /// rows, 16-bit; two stages of m, 1 / l and D [br], f32.
    const fn kv_smem_bytes(&self, br: u32) -> u32 {
        (2 * Self::ROWS + 4 * br) * self.row_stride() * 2 + 6 * br * 4
    }
    /// The deterministic dK/dV kernel's, at kv_br query rows per tile; with `split`, the S^T /
    /// dP^T exchange.
    pub const fn dkdv_smem_bytes(&self) -> u32 {
        self.kv_smem_bytes(self.kv_br) + self.exchange_bytes(self.kv_br)
    }
    /// The atomic backward's dK/dV/dQ kernel ([`mma_bwd_tile_atomic`]): the dK/dV kernel's,
    /// plus dS [kv_br][64] 16-bit.
    pub const fn dkdvq_smem_bytes(&self) -> u32 {
        self.kv_smem_bytes(self.kv_br) + self.kv_br * Self::ROWS * 2
    }
}

/// The tensor-core backward tile for `head_dim`, if there is one: head dims up to 256.
/// Registers per thread are the binding constraint: dQ holds Q and dO fragments (D/4, when
/// dq_q_in_regs), the dQ accumulator (D/2), S and dP (dq_bc/2 each) and its rows' statistics;
/// dK/dV holds two accumulators (D/2 each), S^T, dP^T (kv_br/2 each) and, with kv_in_regs, K
/// and V fragments (D/4).
///
/// Chosen (ptxas 13.0, registers sm_80 / sm_90, no spills, no stack; speeds in
/// benches/RESULTS.md):
/// - D = 32 and 64: Bc = Br = 64, fragments in registers: dq 168 and 246, dkdv 133 and 244.
/// - D = 96: dq Bc = 32 with Q/dO in registers (224 / 222); dkdv Br = 32, K/V re-read from
///   shared memory (233 / 227).
/// - D = 128: dq Bc = 32, Q/dO re-read (244 / 242); dkdv Br = 32, K/V re-read (254 / 255).
/// - D = 192 and 256: `split` = 2, 8 warps; each warp of a pair holds half of D's
///   accumulators and contracts S and dP over its half, the pair adding the halves through
///   shared memory: per warp the kernels of D = 96 / 128 plus the exchange. dq Bc = 32, dkdv
///   Br = 32, fragments re-read: dq 248 / 245 and 245 / 245, dkdv 255 / 254 and 255 / 255 (the warp's half
///   of D read again where used, `bwd_mma::half_now`). Shared memory up to 160.75 KB (32 KB
///   of it the exchange): one block per SM at D = 256.
/// - The atomic family ([`mma_bwd_tile_atomic`]) also holds the dQ product's fragments:
///   dkdv Br = 64 / 32 / 16 / 16 at D = 32 / 64 / 96 / 128 (236, 254, 246, 255 on sm_80).
///
/// Rejected:
/// - D = 128 dkdv Br = 16: 0.8x of Br = 32 (6282a3e); dq Bc = 64: spills 4 bytes on sm_90.
/// - Br = Bc = 64 above D = 64: S and dP 64 registers beside the accumulators (D = 128
///   spilled).
/// - D = 192 / 256 with one warp per 16 rows: dK and dV alone 256 registers; with S and dP
///   recomputed per column half instead of split: 1.5x the dK/dV products.
/// - The atomic family as default: 0.69-0.76x of the deterministic kernels (6282a3e).
pub const fn mma_bwd_tile(head_dim: u32) -> Option<MmaBwdTile> {
    const fn t(head_dim: u32, dq_bc: u32, dq_q_in_regs: bool, kv_br: u32, kv_in_regs: bool, split: u32) -> Option<MmaBwdTile> {
        Some(MmaBwdTile { head_dim, dq_bc, dq_q_in_regs, kv_br, kv_in_regs, split })
    }
    match mma_head_dim(head_dim) {
        Some(32) => t(32, 64, true, 64, true, 1),
        Some(64) => t(64, 64, true, 64, true, 1),
        Some(96) => t(96, 32, true, 32, false, 1),
        Some(128) => t(128, 32, false, 32, false, 1),
        Some(192) => t(192, 32, false, 32, false, 2),
        Some(256) => t(256, 32, false, 32, false, 2),
        _ => None,
    }
}

/// The atomic backward's tile (`mma_atomic`, head_dim <= 128): [`mma_bwd_tile`] with the
/// dK/dV/dQ kernel's query tile, which also holds the dQ product's fragments (the statistics
/// kernel is the dQ kernel's first pass, with its tile).
pub const fn mma_bwd_tile_atomic(head_dim: u32) -> Option<MmaBwdTile> {
    let (kv_br, kv_in_regs) = match mma_head_dim(head_dim) {
        Some(32) => (64, true),
        Some(64) => (32, true),
        Some(96 | 128) => (16, false),
        _ => return None,
    };
    match mma_bwd_tile(head_dim) {
        Some(t) => Some(MmaBwdTile { kv_br, kv_in_regs, ..t }),
        None => None,
    }
}

/// Tile of the Hopper forward kernel (`fwd_wgmma`, sm_90a): `warpgroups` warpgroups of 4
/// warps, each owning 64 query rows (Br = 64 * warpgroups), K/V tiles of `bc` keys,
/// double-buffered. Shared tiles are 128-byte-swizzle canonical wgmma layouts, so the
/// compiled head_dim is a multiple of 64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaTile {
    /// Warpgroups per block (64 query rows each).
    pub warpgroups: u32,
    /// Keys per K/V tile (the N of the S = Q K^T wgmma and the K of O += P V).
    pub bc: u32,
    /// The head_dim compiled for (64, 128, 192 or 256).
    pub head_dim: u32,
    /// Whether smaller head_dims (multiples of 8) are served, zero-padded in shared memory.
    pub padded: bool,
}

impl WgmmaTile {
    /// Query rows per block.
    pub const fn br(&self) -> u32 {
        self.warpgroups * 64
    }
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        self.warpgroups * 128
    }
    /// Shared memory per block, in bytes: Q [br] rows and two stages of K and V [bc] rows of
    /// head_dim 16-bit elements (the base is 1024-byte aligned, as the swizzle atoms need).
    pub const fn smem_bytes(&self) -> u32 {
        (self.br() + 4 * self.bc) * self.head_dim * 2
    }
}

/// The Hopper forward tile for `head_dim`, if there is one (f16 and bf16, sm_90a): every
/// head_dim 8..=256 (a multiple of 8), compiled for 64 (d <= 64), 128 (d 72..=128), 192
/// (d 136..=192) or 256 (d 200..=256), exact at 64, 128, 192 and 256 and zero-padded below.
///
/// Chosen (ptxas 13.0 sm_90a, registers exact / padded, no spills, no stack; speeds in
/// benches/RESULTS.md): one warpgroup per block, as many blocks per SM as registers and shared
/// memory allow. ptxas places a warpgroup's wait for P V before its softmax (`fwd_wgmma`), so
/// a warpgroup never overlaps its exponentials with its own tensor-core work; independent
/// blocks on one SM do (FA3 gets it from two warpgroups in ping-pong, with warp
/// specialisation).
/// - d <= 64: Bc = 128: 168 registers, 72 KB, three blocks per SM.
/// - d 72..=128: Bc = 64: 168 registers, 80 KB, two blocks per SM (shared memory bound).
/// - d 129..=256: Bc = 32, so that two blocks share an SM: D = 192 210-224 / 238, 72 KB; D = 256
///   242 / 255, 96 KB (2 x 128 x 256 registers is the whole register file). O's accumulator
///   is D / 2 registers per thread; P V is one wgmma of N = 128 per two 64-column blocks of V
///   and one of N = 64 for the rest (`fwd_wgmma::pv_k_step`), S = Q K^T m64n32k16.
///
/// Rejected (f16 / bf16, FA paper shapes, s = 1k / 16k non-causal):
/// - d <= 64, Bc = 64 (127 registers, four blocks): 343 / 366 TFLOP/s against Bc = 128's
///   392 / 439.
/// - Two warpgroups, Bc = 128 ([`wgmma_tile_wg2`], one block per SM): d=128 337 / 384
///   against 375 / 406, d=64 244 / 279 against 310 / 326 (before the masked/unmasked split).
/// - D = 256, two warpgroups, Bc = 32 (`wgmma_tile_wg2`'s launch, 244 registers, 128 KB, one
///   block per SM): bf16 s = 512 causal 182 TFLOP/s against 190, s = 16k 415-422 against
///   403-405 (the short causal rows lose, the long ones gain 3-5%).
/// - D = 192 / 256 with Bc = 64: one block per SM (248-255 registers, 120 / 160 KB).
/// - The O_lo epilogue's staging addresses kept live: Bc = 32 spilled 56 bytes (D = 192)
///   and 296-304 (D = 256).
#[allow(clippy::match_overlapping_arm)] // the arms are tried in order
pub const fn wgmma_tile(head_dim: u32) -> Option<WgmmaTile> {
    match head_dim {
        0 | 257.. => None,
        ..=64 => Some(WgmmaTile { warpgroups: 1, bc: 128, head_dim: 64, padded: head_dim != 64 }),
        ..=128 => Some(WgmmaTile { warpgroups: 1, bc: 64, head_dim: 128, padded: head_dim != 128 }),
        ..=192 => Some(WgmmaTile { warpgroups: 1, bc: 32, head_dim: 192, padded: head_dim != 192 }),
        _ => Some(WgmmaTile { warpgroups: 1, bc: 32, head_dim: 256, padded: head_dim != 256 }),
    }
}

/// The tile of the Hopper forward's window, general and variable-length entries: [`wgmma_tile`]'s,
/// the same launch, at head_dim 192 compiled padded (bounds-checked copies; the window's
/// bounds take registers the unpadded kernel has not got). Rejected: unpadded at 192, 255
/// registers and 36 / 44 bytes of spill stores / loads (ptxas, sm_90a).
pub const fn wgmma_window_tile(head_dim: u32) -> Option<WgmmaTile> {
    match wgmma_tile(head_dim) {
        Some(t) if t.head_dim == 192 => Some(WgmmaTile { padded: true, ..t }),
        t => t,
    }
}

/// The first Hopper tile (two warpgroups, Br = 128, Bc = 128: FA3's d=128 tile without its
/// ping-pong), head_dim 64 and 128 exactly, by name (`wgmma_wg2`) for comparison: one block
/// per SM, so nothing hides the softmax (see [`wgmma_tile`]).
pub const fn wgmma_tile_wg2(head_dim: u32) -> Option<WgmmaTile> {
    match head_dim {
        64 | 128 => Some(WgmmaTile { warpgroups: 2, bc: 128, head_dim, padded: false }),
        _ => None,
    }
}

/// Tile of the Hopper backward kernels (`bwd_wgmma`, sm_90a): `split` warpgroups per block, of
/// 64 query rows (dQ, key tiles of `dq_bc`) or 64 keys (dK/dV, query tiles of `br` rows),
/// double-buffered; 128-byte-swizzle tiles, so the compiled head_dim is a multiple of 64, and
/// a multiple of 64 split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaBwdTile {
    /// Query rows per Q/dO tile of the dK/dV kernel (the N of S^T = K Q^T, the K of
    /// dV += P^T dO).
    pub br: u32,
    /// Keys per K/V tile of the dQ kernel (the N of S = Q K^T, the K of dQ += dS K).
    pub dq_bc: u32,
    /// The head_dim compiled for (64 or 128).
    pub head_dim: u32,
    /// Whether smaller head_dims are served, zero-padded in shared memory.
    pub padded: bool,
    /// `.maxnreg` of the dK/dV kernel (0: none, ptxas's choice).
    pub dkdv_max_regs: u32,
    /// `.maxnreg` of the dQ kernel (0: none).
    pub dq_max_regs: u32,
    /// Warpgroups per block. With 2, in the dK/dV kernel the first computes S^T, P^T and
    /// dV, the second dP^T, dS^T and dK (P^T through shared memory); in the dQ kernel each takes half of every key tile, and keeps
    /// head_dim / 2 columns of dQ after the loop.
    pub split: u32,
}

impl WgmmaBwdTile {
    /// Keys per block.
    pub const KEYS: u32 = 64;
    /// Threads per block: `split` warpgroups.
    pub const fn threads(&self) -> u32 {
        128 * self.split
    }
    /// Shared memory in bytes: K, V [64] rows, two stages of Q and dO [br] rows (16-bit), with
    /// two warpgroups the P^T exchange [64][br] (f32), two stages of m, 1 / l and D [br] (f32).
    pub const fn dkdv_smem_bytes(&self) -> u32 {
        let pt = if self.split > 1 { Self::KEYS * self.br * 4 } else { 0 };
        (2 * Self::KEYS + 4 * self.br) * self.head_dim * 2 + pt + 6 * self.br * 4
    }
    /// The dK/dV kernel's shared memory with dQ (the atomic backward): dS^T [64][br] (16-bit)
    /// besides.
    pub const fn dkdvq_smem_bytes(&self) -> u32 {
        self.dkdv_smem_bytes() + Self::KEYS * self.br * 2
    }
    /// The tile of the atomic family's statistics kernel (the dQ kernel without dQ): one
    /// warpgroup.
    pub const fn stats_tile(self) -> Self {
        Self { split: 1, ..self }
    }
    /// The dK/dV kernel's tile in entry `entry` (`crate::ENTRY_*`): this one, but the
    /// variable-length entry at d = 128 splits its products between two warpgroups (S^T and
    /// dV, dP^T and dK, as above 128; why: [`wgmma_bwd_tile`]).
    pub const fn dkdv_entry(self, entry: u8) -> Self {
        if entry == crate::ENTRY_VARLEN && self.head_dim == 128 { Self { split: 2, ..self } } else { self }
    }
    /// The register caps of entry `entry` (`crate::ENTRY_*`): none for the variable-length
    /// entries, whose sequence lookup needs the registers (under `.maxnreg 168` at d = 64 their
    /// dK/dV kernel spilled 68-124 bytes, their dQ kernel 16-24).
    pub const fn caps_in(self, entry: u8) -> Self {
        if entry == crate::ENTRY_VARLEN { Self { dkdv_max_regs: 0, dq_max_regs: 0, ..self } } else { self }
    }
    /// Query rows per block of the dQ kernel.
    pub const ROWS: u32 = 64;
    /// The dQ kernel's shared memory in bytes: Q, dO [64] rows and two stages of K, V [dq_bc]
    /// rows, 16-bit; 8 x 64 ones (16-bit); 8 votes a warpgroup and the hot-tile list (u32,
    /// `bwd_wgmma`).
    pub const fn dq_smem_bytes(&self) -> u32 {
        (2 * Self::ROWS + 4 * self.dq_bc) * self.head_dim * 2 + 8 * 64 * 2 + (8 * self.split + HOT_TILES as u32) * 4
    }
}

/// The Hopper backward tile for `head_dim`, if there is one (f16 and bf16, sm_90a): every
/// head_dim 1..=256, compiled for 64, 128, 192 or 256 (exact there, zero-padded below).
///
/// Chosen (ptxas 13.0 sm_90a, no spills; speeds in benches/RESULTS.md):
/// - One warpgroup per block up to d = 128, as in [`wgmma_tile`] (several blocks per SM hide
///   each other's exponentials); br = dq_bc = 64 keeps S and dP at 32 registers each beside
///   the accumulators (dK, dV: D / 2 each; dQ: D / 2). dK/dV 180 / 243 registers at d = 64 /
///   128, dQ 167 / 217.
/// - Above 128, two warpgroups (one block per SM): in the dK/dV kernel the first computes
///   S^T and dV, the second dP^T and dK (P^T passed through shared memory; 4 products per
///   tile pair, none twice; 252-255 registers at 256, 168 / 228 at 192); the dQ kernel's split
///   each key tile (S, dP, dQ~ over D of 32 keys each, the halves added after the loop: 254),
///   with 96 columns each at 192 after it.
///
/// Rejected:
/// - The variable-length dK/dV entry at d = 128 with one warpgroup (`dkdv_entry` splits it
///   over two: 185-190 registers): the sequence's narrowed lengths and shifted pointers took
///   it to 255 registers, spilling 12-16 bytes in another checkout (ptxas 13.0 moves by
///   symbol names alone there).
/// - The mma.sync kernels above 128 (`mma_bwd_tile`): 0.29-0.58x FA2 at 215be52, against
///   0.56-1.04x for the two warpgroups at 4de1846.
/// - `.maxnreg` 168 / 128 at d = 64 (three and four blocks per SM, 1.2x at 7fde370): with the
///   non-finite checks the kernels spill 8 and 48 bytes under them.
/// - Splitting D between the dK/dV kernel's warpgroups (each computing the block's whole S
///   and dP, 6 products per tile pair for 4): 0.79-1.09x FA2 at d = 256 (b1a8703) against
///   0.87-1.20x (027f1fd); at 192 it cuts a 64-column swizzle block, where an MN-major
///   operand cannot start (192 padded to 256: 0.62-0.94x FA2, against 0.73-1.04x).
/// - In the dK/dV kernel, the second warpgroup's dS^T and dK one query tile behind (the
///   exponentials under its product; Q_{i+1} fetched only mid-iteration): 0.78-0.95x
///   (9f8bcc0).
/// - In the dQ kernel, the first warpgroup S and P, the second dP and dS~, each its own dQ
///   columns (P and dS~ exchanged, three barriers an iteration): 0.89-0.97x the key split
///   (af0a3c3).
/// - Splitting each query tile between them for S^T and dP^T (P^T and dS^T both exchanged,
///   three barriers an iteration): 1.01-1.05x the D split at d = 256 (14132e1).
/// - Above 128, dQ added by the dK/dV kernel (`wgmma_atomic`, the forward's residual: 5
///   products for 7, f32 reds per dQ element per 64 keys): 0.85-0.99x at 192, 0.83-0.92x at
///   256 (295e7aa).
/// - Statistics recomputed in the dQ kernel instead of read from the forward's LSE: 0.75x
///   (74fc232).
/// - d = 64 without `.maxnreg 168` on the window and general entries (ptxas's 179-192
///   registers there, two blocks per SM): 0.85x with a window of 512, 0.76x with ALiBi
///   (23dda39, H100).
pub const fn wgmma_bwd_tile(head_dim: u32) -> Option<WgmmaBwdTile> {
    const fn t(head_dim: u32, d: u32, split: u32) -> Option<WgmmaBwdTile> {
        Some(WgmmaBwdTile { br: 64, dq_bc: 64, head_dim: d, padded: head_dim != d, dkdv_max_regs: 0, dq_max_regs: 0, split })
    }
    match head_dim {
        0 | 257.. => None,
        // Three blocks per SM: at most 170 registers a thread (`caps_in`).
        1..=64 => match t(head_dim, 64, 1) {
            Some(t) => Some(WgmmaBwdTile { dkdv_max_regs: 168, dq_max_regs: 168, ..t }),
            None => None,
        },
        65..=128 => t(head_dim, 128, 1),
        129..=192 => t(head_dim, 192, 2),
        _ => t(head_dim, 256, 2),
    }
}

/// The Hopper atomic backward's tile (`wgmma_atomic`): [`wgmma_bwd_tile`] (its dK/dV kernel
/// also holds dS^T in shared memory and adds dQ; with two warpgroups the second stores dS^T
/// and each adds alternate 64-column blocks of dQ). Its statistics kernel (no dQ) takes one
/// warpgroup at every head_dim ([`WgmmaBwdTile::stats_tile`]).
pub const fn wgmma_bwd_tile_atomic(head_dim: u32) -> Option<WgmmaBwdTile> {
    wgmma_bwd_tile(head_dim)
}

/// f32 of the S / dP exchange of a block whose warp pairs split D (SPLIT = 2; none
/// otherwise): one slot of 16 rows x `cols` for S and for dP per warp.
pub(crate) const fn exchange_floats(split: usize, cols: usize) -> usize {
    if split > 1 { split * MMA_WARPS as usize * 2 * 16 * cols } else { 0 }
}

/// Capacity of the Hopper dQ kernel's list of hot key tiles (`bwd_wgmma`, in shared memory):
/// a row has fewer than 8 keys with P > 1/8 of its key weight (its `HOT_P`), so a 64-row
/// block at most 512.
pub const HOT_TILES: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    /// The Hopper forward's window (and variable-length) entries launch as its plain entry does
    /// (the host derives the launch from `wgmma_tile`): the same rows and threads, and shared
    /// memory within the launch's.
    #[test]
    fn wgmma_entry_tiles_fit_the_plain_launch() {
        for d in 1..=256 {
            let plain = wgmma_tile(d).unwrap();
            let t = wgmma_window_tile(d).unwrap();
            assert_eq!((t.br(), t.threads(), t.head_dim), (plain.br(), plain.threads(), plain.head_dim), "d={d}");
            assert!(t.smem_bytes() <= plain.smem_bytes() && t.bc.is_multiple_of(16), "d={d}");
        }
    }
}
