//! The Hopper forward kernel (sm_90a, FA3's instruction set without its warp
//! specialisation): `wgmma.mma_async` with f32 accumulation for S = Q K^T (A and B from shared
//! memory) and O += P V (P from registers, V from shared memory, transposed by the
//! instruction), cp.async double-buffering of K and V.
//!
//! One block per (Br query rows, head, batch), `WG` warpgroups of 4 warps; warpgroup `wg`
//! owns query rows 64 wg..64 wg + 64 of the block, warp w of it rows 16 w..16 w + 16, so
//! lane 4g + t holds rows g and g + 8 and a row's softmax statistics live in one lane quad
//! (the accumulator layout of wgmma is mma.sync's m16n8 C layout, n-tile by n-tile).
//! Shared tiles are [rows][D] 16-bit in the 128-byte-swizzle canonical layout ([`Sw`]).
//! A kernel compiled for D serves every head_dim d <= D (PAD): columns d..D are zero-filled
//! in shared memory and never stored.

use crate::alibi::Alibi;
use crate::block_info::{BlockInfo, split_tiles, stream_bytes};
use crate::copy::{body_head_dim, by_element, load_tile_in, negate_own_chunks};
use crate::dev::{self, Shared, block, thread, warp, warpgroup};
use crate::dtype::MmaElement;
use crate::epilogue::{lane_store_o_part, quad_store_lse, quad_store_lse_split, warp_stage_o, warp_store_staged};
use crate::mask::{Mask, Window, kv_tiles, kv_unmasked};
use crate::nonfinite::{add_nonfinite, own_chunks_nonfinite, row_at, zero_own_nonfinite};
use crate::params::FwdParams;
use crate::sinks;
use crate::smem::Sw;
use crate::softcap::{Softcap, TanhArg};
use crate::softmax::{Domain, RowState, normalize};
use crate::tile::{Config, WgmmaTile};
use crate::wg_tile::mask_frag;
use core::marker::PhantomData;

/// Entry body for one tile `C` (`tile::wgmma_tile`). Its const parameters are the tile's
/// fields and the counts derived from them, checked against it at compile time (see
/// `tile::Config`): D = head_dim, WG = warpgroups, BC = bc, NS = BC / 8 (n-tiles of S),
/// DN = D / 8 (n-tiles of O), KS = BC / 16 (k-steps of P V), PAD = padded; ENTRY: which
/// entry (plain, window, general, variable-length: `with_window_mask!`).
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim <= D`, 128 WG threads and the tile's
/// `smem_bytes()` bytes of dynamic shared memory; an sm_90a device.
#[inline(always)]
pub unsafe fn entry<
    T: MmaElement,
    C: Config<Tile = WgmmaTile>,
    const D: usize,
    const WG: usize,
    const BC: usize,
    const NS: usize,
    const DN: usize,
    const KS: usize,
    const PAD: bool,
    const ENTRY: u8,
>(
    p: &FwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && WG == t.warpgroups as usize && BC == t.bc as usize && PAD == t.padded);
        assert!(NS * 8 == BC && DN * 8 == D && KS * 16 == BC);
    }
    unsafe {
        with_window_mask!(p: T, QueryRows / C::TILE.br(), ENTRY, M => match by_element(PAD, p.pb.head_dim) {
            false => fwd::<T, C, M, D, WG, BC, NS, DN, KS, PAD, false, ENTRY>(p),
            true => fwd::<T, C, M, D, WG, BC, NS, DN, KS, PAD, true, ENTRY>(p),
        })
    }
}

/// Warpgroup: one k-step of O += P V, acc (DN n-tiles) += A B with A from registers and B
/// MN-major at `b`, its 64-column blocks `block_bytes` apart: one wgmma of N = 8 DN at head_dim
/// 64 and 128, else (N = 192, 256) wgmma of N = 128 on two column blocks each, then one of
/// N = 64 for the rest (the shapes compiled in, `dev::warpgroup`).
#[inline(always)]
fn pv_k_step<const DN: usize>(a: [u32; 4], b: warpgroup::Desc, acc: &mut [[f32; 4]; DN], block_bytes: u32, bf16: bool) {
    let (wide, rest) = acc.as_chunks_mut::<16>();
    let n_wide = wide.len();
    for (i, part) in wide.iter_mut().enumerate() {
        warpgroup::mma_rs::<16, true>(a, b.advance(2 * i * block_bytes as usize), part, true, bf16);
    }
    for (i, part) in rest.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        warpgroup::mma_rs::<8, true>(a, b.advance((2 * n_wide + i) * block_bytes as usize), part, true, bf16);
    }
}

/// Block (its WG warpgroups): the forward pass of one (Br query rows, head, batch): the first
/// copy groups, tile 0's S and softmax, then the KV loop, whose iteration j issues S_j and
/// P_(j-1) V_(j-1) and folds tile j into the online softmax ([`Fwd::step`]), the last P V and
/// the epilogue. ENTRY as [`entry`]'s.
#[inline(always)]
unsafe fn fwd<
    T: MmaElement,
    C: Config<Tile = WgmmaTile>,
    M: Mask,
    const D: usize,
    const WG: usize,
    const BC: usize,
    const NS: usize,
    const DN: usize,
    const KS: usize,
    const PAD: bool,
    const EL: bool,
    const ENTRY: u8,
>(
    p: &FwdParams,
) {
    // The query heads of a KV head as rows of one, where the host packs them.
    let p = &p.gqa_packed::<T>();
    let tile = C::TILE;
    const { assert!(D.is_multiple_of(64) && BC.is_multiple_of(16)) };
    let br = tile.br() as usize;
    let d = body_head_dim::<D, EL>(PAD, p.pb.head_dim);
    if p.pb.head_dim > D as u32 || (!PAD && p.pb.head_dim != D as u32) || d == 0 || block::dim() != tile.threads() {
        thread::trap();
    }
    let kv_bytes = stream_bytes::<T>(p.pb.seqlen_k, D);
    let n_blk = p.pb.seqlen_q.div_ceil(br as u32);
    let (BlockInfo { blk: q_blk, h, b }, split) =
        BlockInfo::rows_split::<M>(n_blk, (p.pb.heads_q, p.pb.heads_kv, p.pb.batch), kv_bytes, p.splits);
    let (wg, w, lane) = (warpgroup::id() as usize, (warp::id() % 4) as usize, warp::lane() as usize);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let h_kv = h / (p.pb.heads_q / p.pb.heads_kv);
    let row0 = q_blk * br as u32;

    // Shared memory: Q [br][D], K stages 0 and 1, V stages 0 and 1 ([BC][D] each).
    let smem: Shared<T> = unsafe { dev::dynamic_shared((br + 4 * BC) * D) };

    let q_g = unsafe { (p.q as *const T).add(p.q_strides.offset(b, row0.min(sq), h) as usize) };
    let k_g = unsafe { (p.k as *const T).add(p.k_strides.offset(b, 0, h_kv) as usize) };
    let v_g = unsafe { (p.v as *const T).add(p.v_strides.offset(b, 0, h_kv) as usize) };

    // Key tiles first..n_tiles (a window's left edge first), masked from n_unmasked on;
    // with a window, masked outside from..to, the tiles every row sees whole.
    let row_end = (row0 + br as u32).min(sq);
    let (mut n_tiles, mut first, mut n_unmasked) = kv_tiles::<M>(&p.pb, row0, row_end, BC as u32);
    let (mut from, mut to) = kv_unmasked::<M>(&p.pb, row0, row_end, BC as u32);
    if p.split_kv() {
        // Split-KV: the block's part of those tiles, and the bounds within it (the same
        // tiles masked).
        (first, n_tiles) = split_tiles(first, n_tiles, split, p.splits);
        let within = |j: usize| j.clamp(first, n_tiles);
        (n_unmasked, from, to) = (within(n_unmasked), within(from), within(to));
    }
    let tile_masked = |j: usize| match M::WINDOW {
        true => j < from || j >= to,
        false => j >= n_unmasked,
    };
    let tiles = Tiles::<T, D, WG, BC, PAD> { p, smem, q_s: smem.slice(0, br * D), br, q_g, k_g, v_g, d, sq, sk, row0 };

    // Copy groups: G_0 = {Q, K_0}, then G_j = {K_j, V_(j-1)} for j >= 1 (K_n does not
    // exist): iteration j needs G_j and issues G_(j+1) into the stages iteration j - 1 freed.
    tiles.load_q();
    if n_tiles > first {
        tiles.load_k(first % 2, (first * BC) as u32);
    }
    thread::cp_async_commit();
    if n_tiles > first {
        if n_tiles > first + 1 {
            tiles.load_k((first + 1) % 2, ((first + 1) * BC) as u32);
        }
        tiles.load_v(first % 2, (first * BC) as u32);
    }
    thread::cp_async_commit();
    // Raw scores; c = |scale| log2 e turns them into the exponent with one FFMA; a negative
    // scale is a positive one on -Q (sign bits flipped once in shared memory).
    let c = T::Dm::factor(p.pb.scale.abs());
    // A softcap (the general entries): t = tanh(raw kf) in place of the raw score, c = cap
    // log2 e, LSE's max term m cap (`softcap`).
    let sc = Softcap::<M>::new(&p.pb);
    let (kf, c, lse_scale) = if sc.on() { sc.raw_factors(p.pb.scale.abs()) } else { (sc.k(0.0), c, p.pb.scale.abs()) };
    // ALiBi (the general entries): natural units, x = raw u + bias, c = log2 e (`alibi`).
    let alibi = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) };
    let (u, c, lse_scale) = alibi.units(c, lse_scale);
    if p.pb.scale < 0.0 {
        tiles.negate_q();
    }

    let mut acc_o = [[0f32; 4]; DN];
    let mut acc_s = [[0f32; 4]; NS];
    let mut pa = [[0u32; 4]; KS];
    let mut rows = [RowState::INIT; 2]; // rows g and g + 8 of this warp's 16
    let f = Fwd::<T, M, D, WG, BC, NS, DN, KS, PAD, ENTRY> {
        tiles,
        n_tiles: &n_tiles,
        row_w: row0 + (wg * 64 + w * 16) as u32,
        q_off: wg * 64 * 64,
        r_warp: wg * 64 + w * 16,
        b,
        h,
        split,
        lane,
        g,
        t,
        c,
        kf,
        lse_scale,
        alibi,
        u,
        _mask: PhantomData,
    };
    if n_tiles > first {
        // The first tile: S, its softmax, P (acc_o is still 0: nothing to rescale).
        thread::cp_async_wait::<1>();
        thread::fence_proxy_async();
        block::sync();
        warpgroup::fence();
        f.issue_s(first % 2, &mut acc_s);
        warpgroup::wait::<0, NS>(&mut acc_s);
        let alpha = f.softmax(first, tile_masked(first), &mut acc_s, &mut rows);
        f.rescale_and_pack(alpha, &acc_s, &mut acc_o, &mut pa);
    }
    // Whether a masked tile's V held a NaN or an infinity (zeroed for the product, added back
    // after the loop).
    let mut bad_v = false;
    // The unmasked iterations, then the masked ones (the causal diagonal, the seqlen_k edge);
    // a window's masked tiles left of its unmasked ones first. `masked` is a literal at each
    // call, so the unmasked iterations carry no mask code; the second flag is whether V_(j-1)
    // is a masked tile's.
    let (lead, split) = match M::WINDOW {
        true => (from.clamp(first + 1, n_tiles.max(first + 1)), to.clamp(first + 1, n_tiles.max(first + 1))),
        false => (first + 1, n_unmasked.clamp(first + 1, n_tiles.max(first + 1))),
    };
    let split = split.max(lead);
    for j in first + 1..lead {
        bad_v |= f.step(j, true, true, &mut acc_s, &mut acc_o, &mut pa, &mut rows);
    }
    for j in lead..split {
        bad_v |= f.step(j, false, M::WINDOW && tile_masked(j - 1), &mut acc_s, &mut acc_o, &mut pa, &mut rows);
    }
    for j in split..n_tiles {
        bad_v |= f.step(j, true, tile_masked(j - 1), &mut acc_s, &mut acc_o, &mut pa, &mut rows);
    }
    if n_tiles > first {
        // O += P_(n-1) V_(n-1).
        thread::cp_async_wait::<0>();
        bad_v |= tiles.sync_v((n_tiles - 1) % 2, tile_masked(n_tiles - 1));
        warpgroup::fence_operands(&mut acc_o);
        warpgroup::fence_fragments(&mut pa);
        warpgroup::fence();
        f.issue_pv((n_tiles - 1) % 2, &pa, &mut acc_o);
        warpgroup::wait::<0, DN>(&mut acc_o);
    } else {
        // No key visible: no barrier has ordered the block's Q copies (and sign flips)
        // before the epilogue reuses the Q tile for O.
        thread::cp_async_wait::<0>();
        block::sync();
    }
    // The epilogue overwrites this warp's rows of Q, which only its own warpgroup's S
    // wgmma read (all complete).

    if bad_v {
        match M::WINDOW {
            true => f.add_masked_nonfinite(&mut acc_o, first, (from, to)),
            false => f.add_masked_nonfinite(&mut acc_o, n_unmasked, (0, 0)),
        }
    }
    f.epilogue(&acc_o, &rows);
}

/// The block's shared tiles and global slices, and the copies between them ([`fwd`] builds
/// it before the first copy).
#[derive(Clone, Copy)]
struct Tiles<'a, T: Copy, const D: usize, const WG: usize, const BC: usize, const PAD: bool> {
    p: &'a FwdParams,
    /// Dynamic shared memory: Q [br][D], K stages 0 and 1, V stages 0 and 1 ([BC][D] each);
    /// `q_s` is its Q tile.
    smem: Shared<T>,
    q_s: Shared<T>,
    /// Query rows per block (64 WG).
    br: usize,
    /// Q from the block's first row; K and V of the (batch, KV head) from key 0.
    q_g: *const T,
    k_g: *const T,
    v_g: *const T,
    /// head_dim (the copies' column bound), seqlen_q, seqlen_k.
    d: u32,
    sq: u32,
    sk: u32,
    /// First query row of the block.
    row0: u32,
}

impl<T: MmaElement, const D: usize, const WG: usize, const BC: usize, const PAD: bool> Tiles<'_, T, D, WG, BC, PAD> {
    /// K stage `stage` ([BC][D]).
    #[inline(always)]
    fn k_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((self.br + stage * BC) * D, BC * D)
    }

    /// V stage `stage` ([BC][D]).
    #[inline(always)]
    fn v_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((self.br + (2 + stage) * BC) * D, BC * D)
    }

    /// Block: the Q tile, rows past seqlen_q zero-filled.
    #[inline(always)]
    fn load_q(&self) {
        let (p, q_s, q_g, sq, row0, d) = (self.p, self.q_s, self.q_g, self.sq, self.row0, self.d);
        // Br is 64 WG rows; ROWS must be a constant, so one arm per warpgroup count.
        unsafe {
            match WG {
                1 => load_tile_in::<T, Sw<64, D>, D, 64, 128, true>(q_s, q_g, p.q_strides.row, sq - row0.min(sq), d),
                2 => load_tile_in::<T, Sw<128, D>, D, 128, 256, true>(q_s, q_g, p.q_strides.row, sq - row0.min(sq), d),
                3 => load_tile_in::<T, Sw<192, D>, D, 192, 384, true>(q_s, q_g, p.q_strides.row, sq - row0.min(sq), d),
                _ => thread::trap(),
            }
        }
    }

    /// Block: one K (or V) tile of BC keys from key c1 into `dst`; bounds checks only where
    /// the tile reaches past seqlen_k or head_dim is padded.
    #[inline(always)]
    fn load_one(&self, dst: Shared<T>, src: *const T, stride: u64, c1: u32) {
        let d = self.d;
        unsafe {
            let src = src.add((c1 as u64 * stride) as usize);
            let limit = self.sk - c1;
            macro_rules! one {
                ($threads:literal) => {
                    if PAD || limit < BC as u32 {
                        load_tile_in::<T, Sw<BC, D>, D, BC, $threads, true>(dst, src, stride, limit, d)
                    } else {
                        load_tile_in::<T, Sw<BC, D>, D, BC, $threads, false>(dst, src, stride, limit, d)
                    }
                };
            }
            match WG {
                1 => one!(128),
                2 => one!(256),
                3 => one!(384),
                _ => thread::trap(),
            }
        }
    }

    /// Block: K tile from key c1 into stage `stage`.
    #[inline(always)]
    fn load_k(&self, stage: usize, c1: u32) {
        self.load_one(self.k_s(stage), self.k_g, self.p.k_strides.row, c1)
    }

    /// Block: V tile from key c1 into stage `stage`.
    #[inline(always)]
    fn load_v(&self, stage: usize, c1: u32) {
        self.load_one(self.v_s(stage), self.v_g, self.p.v_strides.row, c1)
    }

    /// Block, negative scale: the Q tile's sign bits flipped once its copies completed.
    #[inline(always)]
    fn negate_q(&self) {
        let q_s = self.q_s;
        thread::cp_async_wait::<0>();
        match WG {
            1 => negate_own_chunks::<Sw<64, D>, D, 64, 128>(q_s.cast()),
            2 => negate_own_chunks::<Sw<128, D>, D, 128, 256>(q_s.cast()),
            3 => negate_own_chunks::<Sw<192, D>, D, 192, 384>(q_s.cast()),
            _ => thread::trap(),
        }
    }

    /// Block: the barrier that publishes V tile `stage` (its copies complete). Masked tiles
    /// (see `nonfinite`): first this thread's chunks of it with their NaNs and infinities set
    /// to 0, and whether the block found any is returned; without `masked`, the barrier alone.
    #[inline(always)]
    fn sync_v(&self, stage: usize, masked: bool) -> bool {
        if !masked {
            thread::fence_proxy_async();
            block::sync();
            return false;
        }
        macro_rules! scan {
            ($threads:literal) => {{
                let found = own_chunks_nonfinite::<T, Sw<BC, D>, D, BC, $threads>(self.v_s(stage));
                if found {
                    zero_own_nonfinite::<T, Sw<BC, D>, D, BC, $threads>(self.v_s(stage));
                }
                found
            }};
        }
        let found = match WG {
            1 => scan!(128),
            2 => scan!(256),
            _ => scan!(384),
        };
        thread::fence_proxy_async();
        block::sync_any(found)
    }
}

/// What the KV loop's steps and the epilogue read, per warp: the block's [`Tiles`], the key
/// tile counts, the warp's rows ([`fwd`] builds it once Q and the first K, V are in flight);
/// ENTRY as [`entry`]'s.
struct Fwd<
    'a,
    T: Copy,
    M,
    const D: usize,
    const WG: usize,
    const BC: usize,
    const NS: usize,
    const DN: usize,
    const KS: usize,
    const PAD: bool,
    const ENTRY: u8,
> {
    tiles: Tiles<'a, T, D, WG, BC, PAD>,
    /// Key tiles any row of the block sees (the end of the loop). By reference, as the
    /// closures that this struct replaced captured it: read from a value, LLVM narrows it
    /// differently (other PTX).
    n_tiles: &'a usize,
    /// First query row of this warp; its warpgroup's 64 rows of Q (element offset); the
    /// warp's first row in the tile.
    row_w: u32,
    q_off: usize,
    r_warp: usize,
    /// Batch and query head; the part of the keys (split-KV).
    b: u32,
    h: u32,
    split: u32,
    lane: usize,
    g: usize,
    t: usize,
    /// Factor from raw scores to the log2 domain (|scale| log2 e); with a softcap, from
    /// tanh's value t (cap log2 e); with ALiBi, from natural units (log2 e).
    c: f32,
    /// With a softcap, tanh's argument per raw score; the factor from the row max to the
    /// LSE's max term (`Softcap::raw_factors`).
    kf: TanhArg,
    lse_scale: f32,
    /// The head's ALiBi bias, and the factor from raw scores (or tanh values) to natural
    /// units when it is on (`Alibi::units`).
    alibi: Alibi<M>,
    u: f32,
    _mask: PhantomData<M>,
}

impl<
    T: MmaElement,
    M: Mask,
    const D: usize,
    const WG: usize,
    const BC: usize,
    const NS: usize,
    const DN: usize,
    const KS: usize,
    const PAD: bool,
    const ENTRY: u8,
> Fwd<'_, T, M, D, WG, BC, NS, DN, KS, PAD, ENTRY>
{
    /// Warpgroup: issue S_j = Q K_j (D / 16 k-steps of m64n{BC}k16, both operands in shared
    /// memory) as one wgmma group.
    #[inline(always)]
    fn issue_s(&self, stage: usize, acc_s: &mut [[f32; 4]; NS]) {
        for kk in 0..D / 16 {
            let a = warpgroup::desc_sw128(self.tiles.q_s, (kk / 4) * self.tiles.br * 64 + self.q_off + (kk % 4) * 16, 16, 1024);
            let bk = warpgroup::desc_sw128(self.tiles.k_s(stage), (kk / 4) * BC * 64 + (kk % 4) * 16, 16, 1024);
            warpgroup::mma_ss::<NS>(a, bk, acc_s, kk > 0, T::BF16);
        }
        warpgroup::commit();
    }

    /// Warpgroup: issue O += P V_j (BC / 16 k-steps of m64n{D}k16, P from registers, V
    /// [keys][D] read MN-major; a k-step is two wgmma at D = 192 and 256: `pv_k_step`)
    /// as one wgmma group.
    #[inline(always)]
    fn issue_pv(&self, stage: usize, pa: &[[u32; 4]; KS], acc_o: &mut [[f32; 4]; DN]) {
        for (kv, f) in pa.iter().enumerate() {
            let bv = warpgroup::desc_sw128(self.tiles.v_s(stage), kv * 16 * 64, Sw::<BC, D>::BLOCK_BYTES, 1024);
            pv_k_step::<DN>(*f, bv, acc_o, Sw::<BC, D>::BLOCK_BYTES, T::BF16);
        }
        warpgroup::commit();
    }

    /// Thread: mask tile j's scores (when `masked`) and fold them into the rows' online
    /// softmax (m_i, l_i); the scores become P in place; returns alpha per row.
    #[inline(always)]
    fn softmax(&self, j: usize, masked: bool, acc_s: &mut [[f32; 4]; NS], rows: &mut [RowState; 2]) -> [f32; 2] {
        let (g, t, sq, sk) = (self.g, self.t, self.tiles.sq, self.tiles.sk);
        let c0 = (j * BC) as u32;
        // The window's bounds fresh each tile (`Window::opaque`).
        let win = Window::<M>::new(&self.tiles.p.pb).opaque();
        // Capped before the mask (`softcap`; the general entries only).
        if Softcap::<M>::new(&self.tiles.p.pb).on() {
            for a in acc_s.iter_mut() {
                for x in a.iter_mut() {
                    *x = self.kf.tanh_mufu(*x);
                }
            }
        }
        // Biased after the cap, before the mask (`alibi`; the general entries only), less a
        // constant per row off the diagonal band (`r`, added back in the row update).
        // The general entries split ALiBi's bias (`Alibi::frag_split`); the variable-length
        // ones add it whole (`Alibi::frag`): with the split their loop ran 2.5% slower at
        // d = 128, ALiBi or not (benches/RESULTS.md).
        let split = M::BIAS && ENTRY == crate::ENTRY_GENERAL;
        let r = match (self.alibi.on(), split) {
            (true, true) => self.alibi.frag_split::<NS>(acc_s, self.u, c0, self.row_w, (g, t)),
            (true, false) => {
                self.alibi.frag::<NS>(acc_s, self.u, c0, self.row_w, (g, t));
                [0.0; 2]
            }
            (false, _) => [0.0; 2],
        };
        mask_frag::<M, NS>(acc_s, c0, self.row_w, (g, t), (sq, sk), masked, f32::NEG_INFINITY, win);
        let mut s = [[[0f32; 2]; NS]; 2];
        for (n, a) in acc_s.iter().enumerate() {
            for e in 0..4 {
                s[e / 2][n][e % 2] = a[e];
            }
        }
        let mut alpha = [1f32; 2];
        for half in 0..2 {
            alpha[half] = match split {
                true => rows[half].update_raw_shifted::<4>(s[half].as_flattened_mut(), self.c, r[half]),
                false => rows[half].update_raw::<4>(s[half].as_flattened_mut(), self.c),
            };
        }
        for (n, a) in acc_s.iter_mut().enumerate() {
            *a = [s[0][n][0], s[0][n][1], s[1][n][0], s[1][n][1]];
        }
        alpha
    }

    /// Thread: acc_o *= alpha (skipped when no row of the warp got a new max: alpha = 1
    /// exactly), and P to 16 bits in wgmma's A layout (k-step kv: S n-tiles 2kv, 2kv + 1).
    #[inline(always)]
    fn rescale_and_pack(&self, alpha: [f32; 2], acc_s: &[[f32; 4]; NS], acc_o: &mut [[f32; 4]; DN], pa: &mut [[u32; 4]; KS]) {
        if warp::any(alpha[0] != 1.0 || alpha[1] != 1.0) {
            for a in acc_o.iter_mut() {
                a[0] *= alpha[0];
                a[1] *= alpha[0];
                a[2] *= alpha[1];
                a[3] *= alpha[1];
            }
        }
        for (kv, f) in pa.iter_mut().enumerate() {
            let (lo, hi) = (acc_s[2 * kv], acc_s[2 * kv + 1]);
            *f = [T::pack2(lo[0], lo[1]), T::pack2(lo[2], lo[3]), T::pack2(hi[0], hi[1]), T::pack2(hi[2], hi[3])];
        }
    }

    /// Block (wgmma by warpgroup): iteration j >= 1 of the KV loop: S_j = Q K_j, O +=
    /// P_(j-1) V_(j-1) with O first rescaled by tile j - 1's alpha, then tile j's softmax and
    /// P_j; `masked` is a literal at each call, so the unmasked iterations carry no mask code.
    /// With `v_masked` (tile j - 1 is masked) returns whether V_(j-1) held a NaN or an
    /// infinity.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        j: usize,
        masked: bool,
        v_masked: bool,
        acc_s: &mut [[f32; 4]; NS],
        acc_o: &mut [[f32; 4]; DN],
        pa: &mut [[u32; 4]; KS],
        rows: &mut [RowState; 2],
    ) -> bool {
        // Every warpgroup is done with iteration j - 1 (S_(j-1) read K stage (j - 1) % 2,
        // PV_(j-2) read V stage j % 2): G_(j+1) may refill them.
        block::sync();
        if j + 1 < *self.n_tiles {
            self.tiles.load_k((j + 1) % 2, ((j + 1) * BC) as u32);
        }
        self.tiles.load_v(j % 2, (j * BC) as u32);
        thread::cp_async_commit();
        // G_j (K_j, V_(j-1)) landed, for every thread and for the async proxy (V_(j-1) checked
        // for NaNs and infinities if it is a masked tile).
        thread::cp_async_wait::<1>();
        let bad_v = self.tiles.sync_v((j - 1) % 2, v_masked);
        // S_j = Q K_j, then O += P_(j-1) V_(j-1), then the softmax of tile j (FA3's
        // intra-warpgroup order; ptxas still waits for P V before the softmax, so the overlap
        // comes from the other blocks on the SM: see `tile::wgmma_tile`).
        warpgroup::fence_operands(acc_o);
        warpgroup::fence_fragments(pa);
        warpgroup::fence();
        self.issue_s(j % 2, acc_s);
        self.issue_pv((j - 1) % 2, pa, acc_o);
        warpgroup::wait::<1, NS>(acc_s);
        let alpha = self.softmax(j, masked, acc_s, rows);
        // Pinned before the wait: LLVM otherwise sinks the softmax below it, next to its
        // uses, and the overlap is lost (SASS of f09a897: one exp between the two waits).
        let mut al = [[alpha[0], alpha[1], rows[0].l, rows[1].l]];
        warpgroup::fence_operands(&mut al);
        warpgroup::fence_operands(acc_s);
        let alpha = [al[0][0], al[0][1]];
        (rows[0].l, rows[1].l) = (al[0][2], al[0][3]);
        warpgroup::wait::<0, DN>(acc_o);
        // P_(j-1) stays live until P V has read it: else ptxas reuses its registers for the
        // softmax above and must wait for P V first, which serialises the two (SASS).
        warpgroup::fence_fragments(pa);
        self.rescale_and_pack(alpha, acc_s, acc_o, pa);
        bad_v
    }

    /// Thread: the zeroed values of the masked tiles' V (tiles from `masked0` to the end
    /// but for the unmasked ones of `hole`), back into the outputs of the rows that see their
    /// keys (`nonfinite`).
    #[inline(always)]
    fn add_masked_nonfinite(&self, acc_o: &mut [[f32; 4]; DN], masked0: usize, hole: (usize, usize)) {
        let (p, sq, sk, g) = (self.tiles.p, self.tiles.sq, self.tiles.sk, self.g);
        let c0 = (masked0 * BC) as u32;
        let hole = (hole.0.saturating_sub(masked0) * BC, hole.1.saturating_sub(masked0) * BC);
        let v0 = unsafe { self.tiles.v_g.add((c0 as u64 * p.v_strides.row) as usize) };
        let r = self.row_w + g as u32;
        // SAFETY: rows below sk - c0 of V's slice.
        unsafe {
            add_nonfinite::<T, DN>(
                acc_o,
                (*self.n_tiles - masked0) * BC,
                self.tiles.d,
                |k| if hole.0 <= k && k < hole.1 { None } else { row_at(v0, p.v_strides.row, sk - c0, k) },
                |h, k| !Window::<M>::new(&p.pb).hidden(r + 8 * h as u32, c0 + k as u32, sq, sk),
            )
        };
    }

    /// Lane, split-KV: its part's O = acc_o / l_i in f32 from registers into the part's
    /// rows of `o_part`, and the part's f64 LSE as hi and lo f32s (`lse`, and `splits` parts
    /// on); the merge (`merge`) reads them. The sink joins part 0 only (so it joins the
    /// merged denominator once).
    #[inline(always)]
    fn epilogue_part(&self, acc_o: &[[f32; 4]; DN], rows: &[RowState; 2]) {
        let (p, b, h, t, d, sq) = (self.tiles.p, self.b, self.h, self.t, self.tiles.d, self.tiles.sq);
        let split = self.split as u64;
        let o_g = unsafe { (p.o_part as *mut f32).add((split * p.o_split + p.o_strides.offset(b, 0, h)) as usize) };
        let hi_g = unsafe { (p.lse as *mut f32).add((split * p.lse_split + p.lse_row(b, h)) as usize) };
        let lo_g = unsafe { hi_g.add((p.splits as u64 * p.lse_split) as usize) };
        let sink = |r: u32| if split == 0 { unsafe { sinks::of_row(p, h, r) } } else { f32::NEG_INFINITY };
        let r = self.row_w + self.g as u32;
        // Rows r and r + 8, written out: `upper` a constant in each.
        let (inv_l, lse) = sinks::fold64(rows[0].finish_raw64::<4>(self.c, self.lse_scale), sink(r));
        unsafe { lane_store_o_part::<DN>(o_g, p.o_strides.row, (r, sq, d), t, acc_o, false, inv_l) };
        unsafe { quad_store_lse_split(hi_g, lo_g, (r, p.lse_strides.row), sq, t, lse) };
        let (inv_l, lse) = sinks::fold64(rows[1].finish_raw64::<4>(self.c, self.lse_scale), sink(r + 8));
        unsafe { lane_store_o_part::<DN>(o_g, p.o_strides.row, (r + 8, sq, d), t, acc_o, true, inv_l) };
        unsafe { quad_store_lse_split(hi_g, lo_g, (r + 8, p.lse_strides.row), sq, t, lse) };
    }

    /// Warp: O = acc_o / l_i, LSE = m_i + log l_i. The warp stages its 16 rows of O in its own
    /// rows of the Q tile, then writes whole 16-byte chunks; on request O_lo too.
    #[inline(always)]
    fn epilogue(&self, acc_o: &[[f32; 4]; DN], rows: &[RowState; 2]) {
        if self.tiles.p.split_kv() {
            return self.epilogue_part(acc_o, rows);
        }
        let (p, b, h, g, t, lane, d, sq, row0, q_s, r_warp) = (
            self.tiles.p,
            self.b,
            self.h,
            self.g,
            self.t,
            self.lane,
            self.tiles.d,
            self.tiles.sq,
            self.tiles.row0,
            self.tiles.q_s,
            self.r_warp,
        );
        let o_g = unsafe { (p.o as *mut T).add(p.o_strides.offset(b, 0, h) as usize) };
        let lse_g = unsafe { (p.lse as *mut f32).add(p.lse_row(b, h) as usize) };
        let o_words: Shared<u32> = q_s.cast();
        let at = |r: usize, c: usize| match WG {
            1 => Sw::<64, D>::at(r, c),
            2 => Sw::<128, D>::at(r, c),
            _ => Sw::<192, D>::at(r, c),
        };
        let mut inv = [0f32; 2];
        for half in 0..2 {
            let r_tile = r_warp + g + 8 * half;
            let (inv_l, lse) = rows[half].finish_raw::<4>(self.c, self.lse_scale);
            let (inv_l, lse) = sinks::fold((inv_l, lse), unsafe { sinks::of_row(p, h, row0 + r_tile as u32) });
            inv[half] = inv_l;
            warp_stage_o::<T, DN>(o_words, at, (r_tile, t), acc_o, half, inv_l);
            unsafe { quad_store_lse(lse_g, (row0 + r_tile as u32, p.lse_strides.row), sq, t, lse) };
        }
        warp::sync();
        // Warp: its 16 rows.
        let store_staged =
            |dst: *mut T| unsafe { warp_store_staged::<T, D, 1>(q_s, at, (lane, r_warp), (row0, sq, d), dst, p.o_strides.row) };
        store_staged(o_g);
        // On request, the same for O_lo = T(O_f32 - O) (one uniform branch).
        if p.o_lo != 0 {
            warp::sync();
            // The staging addresses recomputed from an opaque lane (else LLVM keeps the first
            // pass's, 2 DN of them, live next to the 4 DN values: at D = 256 ptxas spilled
            // 296-304 bytes, at D = 192 padded 56; `tile::wgmma_tile`).
            let (g, t) = if D > 128 { (thread::opaque(g as u64) as usize, thread::opaque(t as u64) as usize) } else { (g, t) };
            for half in 0..2 {
                let r_tile = r_warp + g + 8 * half;
                for (n, acc) in acc_o.iter().enumerate() {
                    let (x0, x1) = (normalize(acc[2 * half], inv[half]), normalize(acc[2 * half + 1], inv[half]));
                    let (h0, h1) = T::unpack2(T::pack2(x0, x1));
                    o_words.st(at(r_tile, n * 8 + 2 * t) / 2, T::pack2(x0 - h0, x1 - h1));
                }
            }
            warp::sync();
            store_staged(unsafe { (p.o_lo as *mut T).add(p.o_strides.offset(b, 0, h) as usize) });
        }
    }
}
