//! The forward's O/LSE epilogue, warp by warp, for the tensor-core kernels (`fwd_mma`,
//! `fwd_wgmma`): O = acc_o / l_i packed to T and staged in the warp's own rows of the Q
//! tile's shared memory, LSE = m_i + log l_i to global memory, then the staged rows written
//! as whole 16-byte chunks (a lane's 4-byte fragments would fill half of each 32-byte sector).
//! The kernel names the staging layout (`at`: element index of (row, column) in the tile).

use crate::copy::store_chunk;
use crate::dev::{Shared, global};
use crate::dtype::MmaElement;
use crate::softmax::normalize;

/// Warp, one row half of one m16 tile (rows g + 8 half; lane (g, t)): O = acc / l_i
/// (`inv_l`, [`normalize`]) in T into the staging tile at row `r_tile`.
#[inline(always)]
pub(crate) fn warp_stage_o<T: MmaElement, const DN: usize>(
    o_words: Shared<u32>,
    at: impl Fn(usize, usize) -> usize,
    (r_tile, t): (usize, usize),
    acc: &[[f32; 4]; DN],
    half: usize,
    inv_l: f32,
) {
    for (n, acc) in acc.iter().enumerate() {
        let packed = T::pack2(normalize(acc[2 * half], inv_l), normalize(acc[2 * half + 1], inv_l));
        o_words.st(at(r_tile, n * 8 + 2 * t) / 2, packed);
    }
}

/// Lane, split-KV: its values of one row half of an m16 tile (row `r`; columns 8 n + 2 t and
/// 8 n + 2 t + 1 of n-tile n), O = acc / l_i (`inv_l`) in f32, into row r of a part `dst`
/// (row stride `stride`): rows below `sq`, columns below `d`.
///
/// # Safety
/// `dst` points to the head's rows below `sq`, `d` f32 each.
#[inline(always)]
pub(crate) unsafe fn lane_store_o_part<const DN: usize>(
    dst: *mut f32,
    stride: u64,
    (r, sq, d): (u32, u32, u32),
    t: usize,
    acc: &[[f32; 4]; DN],
    upper: bool,
    inv_l: f32,
) {
    if r >= sq {
        return;
    }
    let row = unsafe { dst.add((r as u64 * stride) as usize) };
    for (n, a) in acc.iter().enumerate() {
        let c = (n * 8 + 2 * t) as u32;
        let (x0, x1) = if upper { (a[2], a[3]) } else { (a[0], a[1]) };
        if c < d {
            unsafe { global::store(row.add(c as usize), normalize(x0, inv_l)) };
        }
        if c + 1 < d {
            unsafe { global::store(row.add(c as usize + 1), normalize(x1, inv_l)) };
        }
    }
}

/// Lane quad (its lane t = 0 stores), split-KV: a part's f64 LSE of query row `r` as two
/// f32s, hi = LSE rounded at `hi_g` and lo = LSE - hi at `lo_g` (0 where LSE is not finite),
/// so the merge adds the parts up before its one rounding; rows below `sq` only, `row`
/// elements apart.
///
/// # Safety
/// `hi_g` and `lo_g` point to the head's LSE rows (`sq` of them).
#[inline(always)]
pub(crate) unsafe fn quad_store_lse_split(hi_g: *mut f32, lo_g: *mut f32, (r, row): (u32, u64), sq: u32, t: usize, lse: f64) {
    let hi = lse as f32;
    let lo = if hi.is_finite() { (lse - hi as f64) as f32 } else { 0.0 };
    unsafe { quad_store_lse(hi_g, (r, row), sq, t, hi) };
    unsafe { quad_store_lse(lo_g, (r, row), sq, t, lo) };
}

/// Lane quad (its lane t = 0 stores): LSE of query row `r` of the head at `lse_g`, rows
/// below `sq` only, `row` elements apart (1 but where the rows are packed query heads,
/// `FwdParams::gqa_packed`).
///
/// # Safety
/// `lse_g` points to the head's `sq` LSE values.
#[inline(always)]
pub(crate) unsafe fn quad_store_lse(lse_g: *mut f32, (r, row): (u32, u64), sq: u32, t: usize, lse: f32) {
    if r < sq && t == 0 {
        unsafe { global::store(lse_g.add((r as u64 * row) as usize), lse) };
    }
}

/// Warp (after `warp::sync` on its staged rows): its M16 x 16 rows of the staging tile from
/// `r_first`, D / 8 chunks each, lane `lane` taking chunks lane + 32 i, to query rows
/// row0 + r of `dst` (row stride `stride`): rows below `sq`, columns below `d` (d..D are
/// zero padding, not stored).
///
/// # Safety
/// `dst` points to the head's rows below `sq`, `d` elements each.
#[inline(always)]
pub(crate) unsafe fn warp_store_staged<T: Copy, const D: usize, const M16: usize>(
    staged: Shared<T>,
    at: impl Fn(usize, usize) -> usize,
    (lane, r_first): (usize, usize),
    (row0, sq, d): (u32, u32, u32),
    dst: *mut T,
    stride: u64,
) {
    let cpr = D / 8;
    for i in 0..M16 * 16 * cpr / 32 {
        let e = lane + 32 * i;
        let (r_tile, col) = (r_first + e / cpr, (e % cpr) * 8);
        let r = row0 + r_tile as u32;
        if r < sq && (col as u32) < d {
            let v = staged.ld_16(at(r_tile, col));
            unsafe { store_chunk(dst.add((r as u64 * stride) as usize), col as u32, d, v) };
        }
    }
}
