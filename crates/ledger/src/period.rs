//! UTC days and months: the periods usage is added up over (SPEC 11) and the limits of
//! SPEC 12 reset at.

use std::fmt;
use std::str::FromStr;

use keypool_core::{UnixMs, UtcDateTime};
use serde::{Deserialize, Serialize};

use crate::LedgerError;

const DAY_MS: u64 = 86_400_000;

/// A UTC day, as days since 1970-01-01. Written `2026-12-01`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Day(pub u32);

/// A UTC month, as months since 1970-01. Written `2026-12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Month(pub u32);

impl Day {
    /// The day `at` falls on.
    pub fn of(at: UnixMs) -> Self {
        Self(u32::try_from(at / DAY_MS).unwrap_or(u32::MAX))
    }

    /// When the day starts, unix ms.
    pub fn start(self) -> UnixMs {
        u64::from(self.0) * DAY_MS
    }

    /// When the next day starts (this one's reset), unix ms.
    pub fn end(self) -> UnixMs {
        self.start() + DAY_MS
    }

    /// The month the day is in.
    pub fn month(self) -> Month {
        Month::of(self.start())
    }

    /// The day `days` before this one (saturating at the epoch).
    pub fn minus(self, days: u32) -> Self {
        Self(self.0.saturating_sub(days))
    }
}

impl Month {
    /// The month `at` falls in.
    pub fn of(at: UnixMs) -> Self {
        let t = UtcDateTime::from_unix_secs(at / 1000);
        let months = (t.year.saturating_sub(1970)) * 12 + t.month.saturating_sub(1);
        Self(u32::try_from(months).unwrap_or(u32::MAX))
    }

    fn year_month(self) -> (i64, u32) {
        (1970 + i64::from(self.0 / 12), self.0 % 12 + 1)
    }

    /// When the month starts, unix ms.
    pub fn start(self) -> UnixMs {
        let (y, m) = self.year_month();
        let days = UtcDateTime::days_from_civil(y, m, 1);
        u64::try_from(days).unwrap_or(0) * DAY_MS
    }

    /// When the next month starts (this one's reset), unix ms.
    pub fn end(self) -> UnixMs {
        Month(self.0.saturating_add(1)).start()
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = UtcDateTime::from_unix_secs(self.start() / 1000);
        write!(f, "{:04}-{:02}-{:02}", t.year, t.month, t.day)
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m) = self.year_month();
        write!(f, "{y:04}-{m:02}")
    }
}

fn number(text: &str, digits: usize) -> Option<u32> {
    (text.len() == digits && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

impl FromStr for Day {
    type Err = LedgerError;

    /// `YYYY-MM-DD`, a real date from 1970 on.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || LedgerError::InvalidDate(s.to_owned());
        let mut parts = s.split('-');
        let (Some(y), Some(m), Some(d), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (y, m, d) = (
            number(y, 4).ok_or_else(bad)?,
            number(m, 2).ok_or_else(bad)?,
            number(d, 2).ok_or_else(bad)?,
        );
        if y < 1970 || !(1..=12).contains(&m) || d == 0 {
            return Err(bad());
        }
        let days = UtcDateTime::days_from_civil(i64::from(y), m, d);
        let day = Day(u32::try_from(days).map_err(|_| bad())?);
        // A day past the end of its month (2026-02-30) comes back as another date.
        (day.to_string() == s).then_some(day).ok_or_else(bad)
    }
}

impl FromStr for Month {
    type Err = LedgerError;

    /// `YYYY-MM`, from 1970-01 on.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || LedgerError::InvalidDate(s.to_owned());
        let (y, m) = s.split_once('-').ok_or_else(bad)?;
        let (y, m) = (number(y, 4).ok_or_else(bad)?, number(m, 2).ok_or_else(bad)?);
        if y < 1970 || !(1..=12).contains(&m) {
            return Err(bad());
        }
        Ok(Month((y - 1970) * 12 + m - 1))
    }
}

macro_rules! string_serde {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = LedgerError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                value.parse()
            }
        }
        impl From<$t> for String {
            fn from(value: $t) -> Self {
                value.to_string()
            }
        }
    };
}
string_serde!(Day);
string_serde!(Month);

/// A day or a month: what an aggregate adds up over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// A UTC day.
    Day(Day),
    /// A UTC month.
    Month(Month),
}

impl Period {
    /// When the period ends (its reset), unix ms.
    pub fn end(self) -> UnixMs {
        match self {
            Self::Day(d) => d.end(),
            Self::Month(m) => m.end(),
        }
    }

    /// `day` or `month`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Day(_) => "day",
            Self::Month(_) => "month",
        }
    }
}

impl fmt::Display for Period {
    /// `2026-12-01` or `2026-12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Day(d) => d.fmt(f),
            Self::Month(m) => m.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn days_and_months_read_and_write_their_dates() {
        // 2026-12-01T12:00:00Z
        let at = 1_796_126_400_000;
        assert_eq!(Day::of(at).to_string(), "2026-12-01");
        assert_eq!(Month::of(at).to_string(), "2026-12");
        assert_eq!("2026-12-01".parse::<Day>().unwrap(), Day::of(at));
        assert_eq!("2026-12".parse::<Month>().unwrap(), Month::of(at));
        assert_eq!(Day::of(at).month(), Month::of(at));
        assert_eq!(Day::of(at).end() - Day::of(at).start(), DAY_MS);
        // December's end is January's start.
        assert_eq!(
            Month::of(at).end(),
            "2027-01".parse::<Month>().unwrap().start()
        );
        assert_eq!(
            "2027-01-01".parse::<Day>().unwrap().start(),
            Month::of(at).end()
        );
        assert_eq!(
            "2024-02-29".parse::<Day>().unwrap().to_string(),
            "2024-02-29"
        );
        for bad in [
            "2026-02-30",
            "2025-02-29",
            "2026-13-01",
            "1969-12-31",
            "2026-1-01",
            "2026-12-01x",
            "",
            "2026-12",
        ] {
            assert!(bad.parse::<Day>().is_err(), "{bad}");
        }
        for bad in ["2026-13", "2026-00", "26-12", "2026-12-01", "1969-12"] {
            assert!(bad.parse::<Month>().is_err(), "{bad}");
        }
    }

    proptest! {
        /// Every instant lies within its day and its month, and both write and read
        /// back the same.
        #[test]
        fn an_instant_lies_in_its_day_and_month(at in 0u64..4_102_444_800_000) {
            let (d, m) = (Day::of(at), Month::of(at));
            prop_assert!(d.start() <= at && at < d.end());
            prop_assert!(m.start() <= at && at < m.end());
            prop_assert!(m.start() <= d.start() && d.end() <= m.end());
            prop_assert_eq!(d.to_string().parse::<Day>().unwrap(), d);
            prop_assert_eq!(m.to_string().parse::<Month>().unwrap(), m);
        }
    }
}
