//! Plans and the limits they give a key.
//!
//! Plans come from the configuration (`[gateway.plans.NAME]`). A plan may leave a limit out
//! (enterprise does): such a key must carry its own override from `keys create`.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use serde::Deserialize;

/// The largest limit: the Redis store's script counts in Lua numbers, which are exact up to
/// 2^53. No plan needs more (that is 100 billion requests a second for a day).
pub const MAX_LIMIT: u64 = (1 << 53) - 1;

/// A key's effective limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests admitted per minute window.
    pub per_minute: u64,
    /// Requests admitted per UTC day.
    pub per_day: u64,
}

/// One `[gateway.plans.NAME]` table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// Requests per minute; absent means every key on the plan must override it.
    pub per_minute: Option<NonZeroU64>,
    /// Requests per UTC day; absent means every key on the plan must override it.
    pub per_day: Option<NonZeroU64>,
}

/// The plans by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Plans(pub BTreeMap<String, PlanConfig>);

impl Default for Plans {
    fn default() -> Self {
        Plans::defaults()
    }
}

impl Plans {
    /// The plans of the specification: Free, Pro, Business, and Enterprise (custom).
    pub fn defaults() -> Plans {
        let plan = |m: u64, d: u64| PlanConfig {
            per_minute: NonZeroU64::new(m),
            per_day: NonZeroU64::new(d),
        };
        Plans(BTreeMap::from([
            ("free".to_owned(), plan(60, 1_000)),
            ("pro".to_owned(), plan(300, 10_000)),
            ("business".to_owned(), plan(1_000, 100_000)),
            ("enterprise".to_owned(), PlanConfig::default()),
        ]))
    }

    /// The limits of a key on `plan` with optional overrides, or why there are none.
    pub fn resolve(
        &self,
        plan: &str,
        per_minute: Option<u64>,
        per_day: Option<u64>,
    ) -> Result<Limits, String> {
        let config = self.0.get(plan).ok_or_else(|| {
            let names: Vec<&str> = self.0.keys().map(String::as_str).collect();
            format!("unknown plan `{plan}`; the plans are {}", names.join(", "))
        })?;
        if per_minute == Some(0) || per_day == Some(0) {
            return Err("--per-minute and --per-day must be at least 1".to_owned());
        }
        if [per_minute, per_day]
            .into_iter()
            .flatten()
            .any(|l| l > MAX_LIMIT)
        {
            return Err(format!(
                "--per-minute and --per-day must be at most {MAX_LIMIT} (2^53 - 1)"
            ));
        }
        let per_minute = per_minute
            .or(config.per_minute.map(NonZeroU64::get))
            .ok_or_else(|| format!("plan `{plan}` has no per-minute limit: give --per-minute"))?;
        let per_day = per_day
            .or(config.per_day.map(NonZeroU64::get))
            .ok_or_else(|| format!("plan `{plan}` has no per-day quota: give --per-day"))?;
        Ok(Limits {
            per_minute,
            per_day,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_plans() {
        let plans = Plans::defaults();
        assert_eq!(
            plans.resolve("free", None, None),
            Ok(Limits {
                per_minute: 60,
                per_day: 1_000
            })
        );
        assert_eq!(
            plans.resolve("pro", None, None),
            Ok(Limits {
                per_minute: 300,
                per_day: 10_000
            })
        );
        assert_eq!(
            plans.resolve("business", None, None),
            Ok(Limits {
                per_minute: 1_000,
                per_day: 100_000
            })
        );
        assert!(plans.resolve("enterprise", Some(10), None).is_err());
        assert_eq!(
            plans.resolve("enterprise", Some(10), Some(20)),
            Ok(Limits {
                per_minute: 10,
                per_day: 20
            })
        );
        assert_eq!(
            plans.resolve("free", Some(5), None),
            Ok(Limits {
                per_minute: 5,
                per_day: 1_000
            })
        );
        assert!(plans.resolve("free", Some(0), None).is_err());
        assert!(
            plans
                .resolve("platinum", None, None)
                .unwrap_err()
                .contains("free")
        );
    }
}
