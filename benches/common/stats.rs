//! Medians and spreads of samples, and the rate every table prints.

use std::fmt;

/// The median of `samples`: the middle one, or the mean of the two middle
/// ones of an even count; NaN if there are none (every run of an arm failed).
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A median with the smallest and largest sample, printed as the tables
/// print them: `1.234 (1.100-1.500)`, to the precision given (`{:.3}`), with
/// an optional unit after the median (`1.23 s (1.10-1.50)`).
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    unit: &'static str,
}

impl Spread {
    /// The spread of `samples`; all three NaN if there are none.
    pub fn of(samples: &[f64]) -> Spread {
        let (min, max) = if samples.is_empty() {
            (f64::NAN, f64::NAN)
        } else {
            samples
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                    (lo.min(x), hi.max(x))
                })
        };
        Spread {
            median: median(samples),
            min,
            max,
            unit: "",
        }
    }

    /// The same, printed with `unit` after the median (" s", " ms").
    pub fn unit(self, unit: &'static str) -> Spread {
        Spread { unit, ..self }
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = f.precision().unwrap_or(3);
        let Spread {
            median,
            min,
            max,
            unit,
        } = self;
        write!(f, "{median:.p$}{unit} ({min:.p$}-{max:.p$})")
    }
}

/// GiB per second.
pub fn gib_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / seconds
}
