//! Keel's domain vocabulary: run ids, run states, wait reasons, journal entry status and
//! usage counters. Plain data with string forms; no IO and no serde (the protocol crate
//! owns every wire shape).

use std::fmt;
use std::str::FromStr;

/// A string form did not name a known value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {expected}")]
pub struct ParseError {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Identifies one run. Rendered as `run_` followed by 26 lowercase base32 characters whose
/// first 10 encode the creation time, so ids sort by age.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

impl RunId {
    pub const PREFIX: &'static str = "run_";

    /// A fresh id: 48 bits of milliseconds since the epoch, 80 random bits.
    pub fn generate(unix_ms: u64) -> RunId {
        let mut random = [0u8; 10];
        fill_random(&mut random);
        let mut value: u128 = (u128::from(unix_ms) & 0xFFFF_FFFF_FFFF) << 80;
        for (i, byte) in random.iter().enumerate() {
            value |= u128::from(*byte) << (8 * (9 - i));
        }
        const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
        let mut text = String::with_capacity(Self::PREFIX.len() + 26);
        text.push_str(Self::PREFIX);
        for i in (0..26).rev() {
            let index = ((value >> (5 * i)) & 0x1F) as usize;
            text.push(char::from(ALPHABET[index]));
        }
        RunId(text)
    }

    /// Parses a user-supplied id, checking its shape so that a typo gets a clear error
    /// instead of a "not found".
    pub fn parse(text: &str) -> Result<RunId, ParseError> {
        let ok = text.len() == Self::PREFIX.len() + 26
            && text.starts_with(Self::PREFIX)
            && text[Self::PREFIX.len()..].bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
        if ok {
            Ok(RunId(text.to_owned()))
        } else {
            Err(ParseError {
                what: "run id",
                value: text.to_owned(),
                expected: "run_ followed by 26 lowercase letters or digits (see `keel ps`)",
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Fills `buf` from the OS random source. Failure of getrandom means the host has no
/// usable entropy source at all; nothing sensible can continue, so it aborts loudly.
pub fn fill_random(buf: &mut [u8]) {
    // Invariant: getrandom only fails on hosts without /dev/urandom or getrandom(2).
    getrandom::fill(buf).expect("the OS random source (getrandom) is unavailable");
}

/// A fresh secret: 32 random bytes, hex encoded.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    fill_random(&mut bytes);
    hex(&bytes)
}

/// Lower-case hex of `bytes`, the form of every hash and token Keel stores. (The `hex`
/// crate's `encode` collects an iterator of chars; this runs on every journal write.)
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Bytes first, then one check: pushing `char`s checks capacity and encodes each one,
    // and this runs for every hash a journaled call stores (several a message).
    let mut text = Vec::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.extend_from_slice(&[DIGITS[usize::from(byte >> 4)], DIGITS[usize::from(byte & 0x0f)]]);
    }
    String::from_utf8(text).unwrap_or_default()
}

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseError;
            fn from_str(s: &str) -> Result<Self, ParseError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParseError {
                        what: $what,
                        value: s.to_owned(),
                        expected: concat!($($text, " "),+),
                    }),
                }
            }
        }
    };
}

string_enum! {
    /// Where a run is in its life (DESIGN section 2). The string forms are part of the
    /// wire contract and never change.
    RunState, "run state" {
        Created => "created",
        Queued => "queued",
        Running => "running",
        Paused => "paused",
        Waiting => "waiting",
        Recovering => "recovering",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

impl RunState {
    /// Succeeded, failed and cancelled runs never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed | RunState::Cancelled)
    }
}

string_enum! {
    /// Why a run in `waiting` is parked.
    WaitReason, "wait reason" {
        Human => "human",
        Child => "child",
        Message => "message",
        Approval => "approval",
        Budget => "budget",
        Timer => "timer",
    }
}

string_enum! {
    /// The state of one journal entry. `pending` is an intent without a result (the
    /// crash window); `abandoned` is a replay-tail entry the restarted agent never asked
    /// for again, kept for audit.
    EntryStatus, "journal entry status" {
        Pending => "pending",
        Ok => "ok",
        Error => "error",
        Abandoned => "abandoned",
    }
}

/// What a run has consumed so far. Cost is kept in micro-dollars so that sums are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub cost_micro_usd: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.llm_calls += other.llm_calls;
        self.tool_calls += other.tool_calls;
        self.cost_micro_usd += other.cost_micro_usd;
    }

    pub fn cost_usd(&self) -> f64 {
        self.cost_micro_usd as f64 / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_the_hex_crates_lower_case_for_every_byte() {
        let every: Vec<u8> = (0..=255).collect();
        assert_eq!(hex(&every), ::hex::encode(&every));
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x0f, 0xa0]), "0fa0");
        assert_eq!(random_token().len(), 64);
    }

    #[test]
    fn run_ids_round_trip_and_sort_by_time() {
        let a = RunId::generate(1_000);
        let b = RunId::generate(2_000);
        assert!(a < b);
        assert_eq!(RunId::parse(a.as_str()).unwrap(), a);
        assert!(RunId::parse("run_short").is_err());
        assert!(RunId::parse("job_0000000000000000000000000").is_err());
    }

    #[test]
    fn tokens_are_64_lowercase_hex_digits_and_fresh() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn state_strings_round_trip() {
        for state in RunState::ALL {
            assert_eq!(state.as_str().parse::<RunState>().unwrap(), *state);
        }
        let err = "runnin".parse::<RunState>().unwrap_err();
        assert!(err.to_string().contains("running"));
    }
}
