//! The CPU emulator catches the bugs a GPU hides: each planted bug below must be reported
//! (not hang, not pass), and the same kernels without the bug must run clean.

use flashattn::kernels::dev::emu::{EmuError, GlobalRegion, LaunchConfig, launch};
use flashattn::kernels::dev::{self, block, global, thread, warp};
use libtest_mimic::{Arguments, Failed, Trial};

const N: u32 = 128;

fn cfg(smem_floats: usize) -> LaunchConfig {
    LaunchConfig { grid: (2, 1, 1), block_threads: N, dynamic_shared_bytes: smem_floats * 4 }
}

fn expect_fault(r: Result<(), EmuError>, needle: &str) -> Result<(), Failed> {
    match r {
        Ok(()) => Err(format!("the planted bug was not caught (expected a report containing `{needle}`)").into()),
        Err(e) if e.message.contains(needle) => {
            eprintln!("caught as expected: {e}");
            Ok(())
        }
        Err(e) => Err(format!("caught, but reported as `{e}`, expected `{needle}`").into()),
    }
}

fn clean(r: Result<(), EmuError>) -> Result<(), Failed> {
    r.map_err(|e| Failed::from(format!("false report on a correct kernel: {e}")))
}

/// Phase 1 writes s[t]; phase 2 reads the neighbour's s[t+1] and overwrites s[t].
/// Without the second barrier a thread may overwrite s[t] before thread t-1 has read it.
fn neighbour_kernel(second_barrier: bool) {
    let s = unsafe { dev::dynamic_shared::<f32>(N as usize) };
    let t = thread::idx();
    s.st(t as usize, t as f32);
    block::sync();
    let x = s.ld(((t + 1) % N) as usize);
    if second_barrier {
        block::sync();
    }
    s.st(t as usize, x * 2.0);
}

/// Threads below 64 and the others each reach a barrier, but at two different places in the
/// code (a divergent barrier: the emulator tells barriers apart by their call site).
#[allow(clippy::if_same_then_else, reason = "the two identical branches are the planted bug: two distinct barrier call sites")]
fn two_barriers_kernel() {
    if thread::idx() < 64 {
        block::sync();
    } else {
        block::sync();
    }
}

/// Each thread copies 16 bytes (4 floats) of a global buffer into shared memory with
/// cp.async, then, after a barrier, reads a neighbour's chunk. Without the wait the copy may
/// still be in flight.
fn async_copy_kernel(src: usize, wait: bool) {
    let s = unsafe { dev::dynamic_shared::<f32>(4 * N as usize) };
    let t = thread::idx() as usize;
    unsafe { thread::cp_async_16(s, 4 * t, (src as *const f32).add(4 * t), true) };
    thread::cp_async_commit();
    if wait {
        thread::cp_async_wait::<0>();
    }
    block::sync();
    let _ = s.ld(4 * ((t + 1) % N as usize));
}

fn trials() -> Vec<Trial> {
    vec![
        Trial::test("planted_missing_cp_async_wait", || {
            let buf = vec![1u128; N as usize];
            let region = [GlobalRegion { start: buf.as_ptr() as usize, len: buf.len() * 16, writable: false }];
            let p = buf.as_ptr() as usize;
            expect_fault(launch("no_wait", &cfg(4 * N as usize), &region, &|| async_copy_kernel(p, false)), "still in flight")
        }),
        Trial::test("cp_async_with_wait_is_clean", || {
            let buf = vec![1u128; N as usize];
            let region = [GlobalRegion { start: buf.as_ptr() as usize, len: buf.len() * 16, writable: false }];
            let p = buf.as_ptr() as usize;
            clean(launch("with_wait", &cfg(4 * N as usize), &region, &|| async_copy_kernel(p, true)))
        }),
        Trial::test("planted_misaligned_global_access", || {
            let buf = vec![0u32; 2 * N as usize + 1];
            let region = [GlobalRegion { start: buf.as_ptr() as usize, len: buf.len() * 4, writable: true }];
            let p = buf.as_ptr() as usize + 2;
            expect_fault(
                launch("misaligned", &cfg(0), &region, &|| unsafe { global::store((p as *mut u32).add(thread::idx() as usize), 1) }),
                "not aligned",
            )
        }),
        Trial::test("planted_missing_barrier_is_a_race", || {
            expect_fault(launch("missing_barrier", &cfg(N as usize), &[], &|| neighbour_kernel(false)), "race")
        }),
        Trial::test("same_kernel_with_the_barrier_is_clean", || {
            clean(launch("with_barrier", &cfg(N as usize), &[], &|| neighbour_kernel(true)))
        }),
        Trial::test("planted_divergent_barrier_is_reported_not_hung", || {
            // Only the first warp reaches the barrier; the others exit.
            expect_fault(
                launch("divergent_barrier", &cfg(0), &[], &|| {
                    if thread::idx() < 32 {
                        block::sync();
                    }
                }),
                "not reached by every thread",
            )
        }),
        Trial::test("planted_barriers_at_different_places", || {
            expect_fault(launch("two_barriers", &cfg(0), &[], &two_barriers_kernel), "divergent block barrier")
        }),
        Trial::test("planted_out_of_bounds_shared_access", || {
            expect_fault(
                launch("smem_oob", &cfg(N as usize), &[], &|| {
                    let s = unsafe { dev::dynamic_shared::<f32>(N as usize) };
                    s.st(thread::idx() as usize + 5, 1.0);
                }),
                "outside the block's",
            )
        }),
        Trial::test("planted_read_of_unwritten_shared_memory", || {
            expect_fault(
                launch("smem_uninit", &cfg(N as usize), &[], &|| {
                    let s = unsafe { dev::dynamic_shared::<f32>(N as usize) };
                    let _ = s.ld(thread::idx() as usize);
                }),
                "no thread has written",
            )
        }),
        Trial::test("planted_warp_collective_in_half_a_warp", || {
            expect_fault(
                launch("half_warp_shuffle", &cfg(0), &[], &|| {
                    if warp::lane() < 16 {
                        let _ = warp::shfl_xor(1.0, 1);
                    }
                }),
                "not reached by every thread",
            )
        }),
        Trial::test("planted_out_of_bounds_global_access", || {
            let buf = vec![0f32; 64];
            let region = [GlobalRegion { start: buf.as_ptr() as usize, len: 64 * 4, writable: false }];
            let p = buf.as_ptr() as usize;
            expect_fault(
                launch("global_oob", &cfg(0), &region, &|| {
                    let _ = unsafe { global::load((p as *const f32).add(thread::idx() as usize)) };
                }),
                "outside every buffer",
            )
        }),
        Trial::test("write_to_read_only_global_buffer", || {
            let buf = vec![0f32; N as usize];
            let region = [GlobalRegion { start: buf.as_ptr() as usize, len: buf.len() * 4, writable: false }];
            let p = buf.as_ptr() as usize;
            expect_fault(
                launch("global_ro", &cfg(0), &region, &|| unsafe { global::store((p as *mut f32).add(thread::idx() as usize), 1.0) }),
                "writable",
            )
        }),
        Trial::test("trap_is_reported", || {
            expect_fault(
                launch("trap", &cfg(0), &[], &|| {
                    if thread::idx() == 77 {
                        thread::trap();
                    }
                }),
                "thread 77 executed trap",
            )
        }),
        Trial::test("shuffles_follow_the_ptx_butterfly", || {
            let out = vec![0f32; 2 * N as usize];
            let region = [GlobalRegion { start: out.as_ptr() as usize, len: out.len() * 4, writable: true }];
            let p = out.as_ptr() as usize;
            clean(launch("shuffle", &cfg(0), &region, &|| {
                let t = thread::idx();
                let x = warp::shfl_xor(t as f32, 5);
                let sum = warp::allreduce_sum(warp::lane() as f32);
                let max = warp::allreduce_max(t as f32);
                let ok = x == (t ^ 5) as f32 && sum == 496.0 && max == (warp::id() * 32 + 31) as f32;
                let (b, _, _) = block::idx();
                unsafe { global::store((p as *mut f32).add((b * N + t) as usize), if ok { 1.0 } else { -1.0 }) };
            }))?;
            if out.iter().all(|&x| x == 1.0) { Ok(()) } else { Err("wrong shuffle results".into()) }
        }),
        Trial::test("warp_sync_orders_lanes_of_one_warp", || {
            // Each lane writes its slot, warp barrier, reads its neighbour's: correct, no report.
            clean(launch("warp_exchange", &cfg(N as usize), &[], &|| {
                let s = unsafe { dev::dynamic_shared::<f32>(N as usize) };
                let t = thread::idx();
                s.st(t as usize, 1.0);
                warp::sync();
                let _ = s.ld((t & !31 | (t + 1) & 31) as usize);
            }))
        }),
        Trial::test("planted_missing_warp_sync", || {
            expect_fault(
                launch("warp_race", &cfg(N as usize), &[], &|| {
                    let s = unsafe { dev::dynamic_shared::<f32>(N as usize) };
                    let t = thread::idx();
                    s.st(t as usize, 1.0);
                    block::sync();
                    let _ = s.ld((t & !31 | (t + 1) & 31) as usize);
                    s.st(t as usize, 2.0);
                }),
                "race",
            )
        }),
        Trial::test("ln_f64_matches_std", || {
            // The kernels' LSE log (softmax::ln_f64) against std's: powers of two, their
            // neighbours, the split point sqrt(2), subnormals, and a sweep of the exponent range.
            let mut xs = vec![1.0f32, 2.0, 0.5, f32::MIN_POSITIVE, f32::MAX, 1.0e-45, 1.0e-40, 131_072.0];
            let sqrt2 = std::f32::consts::SQRT_2;
            xs.extend([sqrt2, sqrt2.next_up(), sqrt2.next_down()]);
            xs.extend((0..200_000u32).map(|i| f32::from_bits(1 + i.wrapping_mul(2_654_435_761) % 0x7f7f_ffff)));
            for x in [1.0f32, 2.0, 4096.0] {
                xs.extend([x.next_up(), x.next_down()]);
            }
            for x in xs {
                let (got, want) = (flashattn::kernels::softmax::ln_f64(x), (x as f64).ln());
                let err = (got - want).abs();
                if err.is_nan() || err > 1e-14 * want.abs().max(1.0) {
                    return Err(format!("ln_f64({x:e}) = {got:e}, std {want:e}").into());
                }
            }
            Ok(())
        }),
    ]
}

fn main() {
    libtest_mimic::run(&Arguments::from_args(), trials()).exit();
}
