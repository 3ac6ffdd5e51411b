//! Restart strategies: whether and when a failed job restarts from its latest checkpoint.

use std::time::Duration;

use anyhow::Result;

use crate::spec::RestartSpec;
use crate::spec::limits;
use crate::spec::values::RestartStrategyName;

/// What to do when a job fails.
#[derive(Debug, Clone, PartialEq)]
pub enum RestartStrategy {
    /// Fail the job.
    None,
    /// Restart up to `attempts` times, waiting `delay` each time.
    FixedDelay {
        /// Most restarts.
        attempts: u32,
        /// Wait before each.
        delay: Duration,
    },
    /// Restart up to `attempts` times, the wait growing by `multiplier` up to `max`.
    Exponential {
        /// Most restarts.
        attempts: u32,
        /// Wait before the first.
        initial: Duration,
        /// Longest wait.
        max: Duration,
        /// Growth per restart.
        multiplier: f64,
    },
}

impl RestartStrategy {
    /// The strategy a `[restart]` table asks for, each number within its range (see
    /// [`limits`]). Without one: [`limits::RESTART_ATTEMPTS`] restarts
    /// [`limits::RESTART_DELAY_MS`] apart when the job checkpoints (a restart then loses
    /// nothing), none otherwise.
    pub fn from_spec(spec: Option<&RestartSpec>, checkpointing: bool) -> Result<Self> {
        let Some(spec) = spec else {
            return Ok(if checkpointing {
                RestartStrategy::FixedDelay {
                    attempts: limits::RESTART_ATTEMPTS.default,
                    delay: Duration::from_millis(limits::RESTART_DELAY_MS.default),
                }
            } else {
                RestartStrategy::None
            });
        };
        let attempts = limits::RESTART_ATTEMPTS.resolve(spec.attempts)?;
        let delay =
            Duration::from_millis(limits::RESTART_DELAY_MS.resolve(spec.delay_ms.map(|m| m.0))?);
        let max_delay = limits::RESTART_MAX_DELAY_MS.resolve(spec.max_delay_ms.map(|m| m.0))?;
        let multiplier = limits::RESTART_MULTIPLIER.resolve(spec.multiplier)?;
        Ok(match spec.strategy {
            RestartStrategyName::None => RestartStrategy::None,
            RestartStrategyName::FixedDelay => RestartStrategy::FixedDelay { attempts, delay },
            RestartStrategyName::Exponential => RestartStrategy::Exponential {
                attempts,
                initial: delay,
                max: Duration::from_millis(max_delay),
                multiplier,
            },
        })
    }

    /// The wait before restart number `restart` (1 for the first), or `None` when the
    /// strategy allows no more restarts.
    pub fn delay_before(&self, restart: u32) -> Option<Duration> {
        match self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { attempts, delay } => {
                (restart <= *attempts).then_some(*delay)
            }
            RestartStrategy::Exponential {
                attempts,
                initial,
                max,
                multiplier,
            } => (restart <= *attempts).then(|| {
                let factor = multiplier.powi(restart.saturating_sub(1) as i32);
                // Past what a `Duration` holds (after many restarts), the maximum.
                Duration::try_from_secs_f64(initial.as_secs_f64() * factor)
                    .map_or(*max, |d| d.min(*max))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::values::Millis;

    fn spec(strategy: RestartStrategyName) -> RestartSpec {
        RestartSpec {
            strategy,
            attempts: Some(3),
            delay_ms: Some(Millis(100)),
            max_delay_ms: Some(Millis(250)),
            multiplier: None,
        }
    }

    #[test]
    fn strategies_give_delays_until_attempts_run_out() {
        let fixed = RestartStrategy::from_spec(Some(&spec(RestartStrategyName::FixedDelay)), false)
            .unwrap();
        let ms = Duration::from_millis;
        assert_eq!(
            (1..=4).map(|r| fixed.delay_before(r)).collect::<Vec<_>>(),
            vec![Some(ms(100)), Some(ms(100)), Some(ms(100)), None]
        );
        let exp = RestartStrategy::from_spec(Some(&spec(RestartStrategyName::Exponential)), false)
            .unwrap();
        assert_eq!(
            (1..=4).map(|r| exp.delay_before(r)).collect::<Vec<_>>(),
            vec![Some(ms(100)), Some(ms(200)), Some(ms(250)), None]
        );
        // Long after the delay reached its maximum, still the maximum (no overflow).
        let many = RestartStrategy::from_spec(
            Some(&RestartSpec {
                attempts: Some(1_000_000),
                ..spec(RestartStrategyName::Exponential)
            }),
            false,
        )
        .unwrap();
        assert_eq!(many.delay_before(5_000), Some(ms(250)));
        let none =
            RestartStrategy::from_spec(Some(&spec(RestartStrategyName::None)), true).unwrap();
        assert_eq!(none.delay_before(1), None);
    }

    #[test]
    fn defaults_depend_on_checkpointing() {
        assert_eq!(
            RestartStrategy::from_spec(None, false).unwrap(),
            RestartStrategy::None
        );
        assert!(
            RestartStrategy::from_spec(None, true)
                .unwrap()
                .delay_before(3)
                .is_some()
        );
    }
}
