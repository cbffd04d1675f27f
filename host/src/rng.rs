//! A small seedable generator for test and benchmark inputs (standard normal values, as the
//! FlashAttention papers' tests use), shared by the CLI, the tests and the benches.

use crate::dtype::Dtype;

/// SplitMix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` standard normal values in dtype `T`.
    pub fn tensor<T: Dtype>(&mut self, n: usize) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.normal())).collect()
    }
}

/// Elements per chunk of [`normal_tensor`]; each chunk draws from a seed of its own.
pub const CHUNK: usize = 1 << 16;

/// `n` standard normal values in dtype `T` from `seed`, generated on all cores: chunk `c`
/// (elements `c * CHUNK ..`) comes from its own [`Rng`] seeded from `(seed, c)`, so the values
/// depend on the seed alone, not on the number of threads. (Large problems: a billion
/// elements take about a minute on one core.) Not the same values as [`Rng::tensor`].
pub fn normal_tensor<T: Dtype>(seed: u64, n: usize) -> Vec<T> {
    normal_tensor_on(seed, n, std::thread::available_parallelism().map_or(1, |t| t.get()))
}

fn normal_tensor_on<T: Dtype>(seed: u64, n: usize, threads: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let chunks = n.div_ceil(CHUNK);
    let threads = threads.clamp(1, chunks.max(1));
    let per_thread = chunks.div_ceil(threads).max(1) * CHUNK;
    std::thread::scope(|scope| {
        for (t, span) in out.chunks_mut(per_thread).enumerate() {
            scope.spawn(move || {
                for (c, chunk) in span.chunks_mut(CHUNK).enumerate() {
                    let index = (t * per_thread / CHUNK + c) as u64;
                    // A seed per chunk: one SplitMix64 step away from (seed, index).
                    let mut rng = Rng::new(Rng::new(seed ^ index.wrapping_mul(0xd1b5_4a32_d192_ed03)).next_u64());
                    chunk.iter_mut().for_each(|x| *x = T::from_f64(rng.normal()));
                }
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn normal_tensor_does_not_depend_on_threads() {
        let n = 5 * super::CHUNK + 123;
        let one: Vec<f32> = super::normal_tensor_on(7, n, 1);
        for threads in [2, 3, 8, 64] {
            assert_eq!(one, super::normal_tensor_on::<f32>(7, n, threads), "{threads} threads");
        }
        let mean = one.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let var = one.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
        assert_ne!(one[..super::CHUNK], one[super::CHUNK..2 * super::CHUNK], "chunks must differ");
    }
}
