//! Calendar dates of Unix times, in UTC, for the timestamps Lazaret prints
//! and names files with (quarantine IDs, `lazaret audit`, image records):
//! one conversion shared by every crate instead of a date library.

/// A Unix time split into its UTC calendar date and time of day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    /// The year (proleptic Gregorian).
    pub year: i64,
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
    /// 0 to 23.
    pub hour: u32,
    /// 0 to 59.
    pub minute: u32,
    /// 0 to 59.
    pub second: u32,
}

impl Utc {
    /// The UTC date and time `secs` seconds after the Unix epoch.
    pub fn from_unix(secs: u64) -> Utc {
        let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
        let rest = secs % 86_400;
        // Civil-from-days (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        Utc {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: (rest / 3600) as u32,
            minute: (rest % 3600 / 60) as u32,
            second: (rest % 60) as u32,
        }
    }

    /// RFC 3339 in whole seconds: `YYYY-MM-DDTHH:MM:SSZ`.
    pub fn rfc3339(&self) -> String {
        format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", self.year, self.month, self.day, self.hour, self.minute, self.second)
    }

    /// For people, as `lazaret` prints times: `YYYY-MM-DD HH:MM:SS` (UTC).
    pub fn readable(&self) -> String {
        format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02}", self.year, self.month, self.day, self.hour, self.minute, self.second)
    }
}

#[cfg(test)]
mod tests {
    use super::Utc;

    #[test]
    fn known_dates() {
        assert_eq!(Utc::from_unix(0), Utc { year: 1970, month: 1, day: 1, hour: 0, minute: 0, second: 0 });
        // 2000-02-29, a leap day of a century year divisible by 400.
        assert_eq!(Utc::from_unix(11_016 * 86_400 + 3_723), Utc { year: 2000, month: 2, day: 29, hour: 1, minute: 2, second: 3 });
        assert_eq!(Utc::from_unix(1_796_165_040).year, 2026);
    }

    #[test]
    fn formats() {
        assert_eq!(Utc::from_unix(0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Utc::from_unix(0).readable(), "1970-01-01 00:00:00");
        // The leap day of 2024, the last second of the day.
        let leap = Utc::from_unix(1_709_251_199);
        assert_eq!(leap.rfc3339(), "2024-02-29T23:59:59Z");
        assert_eq!(leap.readable(), "2024-02-29 23:59:59");
    }
}
