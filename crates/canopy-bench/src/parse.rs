//! Parsing what the benchmark programs and valgrind write.
//!
//! Every benchmark program ends with one line of `key=value` pairs separated
//! by spaces, for example
//! `checksum=200115000000 seconds=0.016668 pairs=400000 mode=malloc x=25`.
//! Callgrind writes its event totals as a `totals:` line (older versions: a
//! `summary:` line) in the file named by `--callgrind-out-file`.

use std::collections::BTreeMap;

use anyhow::{anyhow, Context, Result};

/// The `key=value` pairs of one result line, in key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResultLine {
    /// The fields as written; a key that appears twice keeps its last value.
    pub fields: BTreeMap<String, String>,
}

impl ResultLine {
    /// Parse one line.  Tokens without `=` are ignored; an empty key is an error.
    pub fn parse(line: &str) -> Result<Self> {
        let mut fields = BTreeMap::new();
        for token in line.split_whitespace() {
            if let Some((k, v)) = token.split_once('=') {
                if k.is_empty() {
                    return Err(anyhow!("empty key in result line {line:?}"));
                }
                fields.insert(k.to_string(), v.to_string());
            }
        }
        Ok(ResultLine { fields })
    }

    /// The result line in a program's standard output: the last line that has
    /// a `checksum=` field.
    pub fn find_in(stdout: &str) -> Result<Self> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.split_whitespace().any(|t| t.starts_with("checksum=")))
            .ok_or_else(|| anyhow!("no result line (with checksum=...) in the program's output"))?;
        Self::parse(line)
    }

    /// A field as text.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// A required field parsed as `T`.
    pub fn require<T: std::str::FromStr>(&self, key: &str) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self
            .get(key)
            .ok_or_else(|| anyhow!("result line has no {key}= field"))?;
        raw.parse::<T>()
            .map_err(|e| anyhow!("bad {key}={raw}: {e}"))
    }

    /// The checksum, always an unsigned 64-bit integer.
    pub fn checksum(&self) -> Result<u64> {
        self.require("checksum")
    }

    /// The kernel time in seconds.
    pub fn seconds(&self) -> Result<f64> {
        let s: f64 = self.require("seconds")?;
        if !s.is_finite() || s < 0.0 {
            return Err(anyhow!("bad seconds={s}"));
        }
        Ok(s)
    }
}

/// The total instruction count (event `Ir`) of a callgrind output file.
///
/// Uses the `events:` line to find the position of `Ir` (the first event
/// unless the run was configured otherwise) and reads that column of the
/// `totals:` line, or of the `summary:` line when there is no `totals:`.
pub fn callgrind_total_ir(text: &str) -> Result<u64> {
    let mut ir_index = 0usize;
    let mut totals = None;
    let mut summary = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("events:") {
            if let Some(i) = rest.split_whitespace().position(|e| e == "Ir") {
                ir_index = i;
            }
        } else if let Some(rest) = line.strip_prefix("totals:") {
            totals = Some(rest.to_string());
        } else if let Some(rest) = line.strip_prefix("summary:") {
            summary = Some(rest.to_string());
        }
    }
    let values = totals
        .or(summary)
        .ok_or_else(|| anyhow!("no totals: or summary: line in the callgrind output"))?;
    let field = values
        .split_whitespace()
        .nth(ir_index)
        .ok_or_else(|| anyhow!("the callgrind totals line {values:?} has no column {ir_index}"))?;
    field
        .parse::<u64>()
        .with_context(|| format!("bad instruction count {field:?} in callgrind output"))
}

/// Parse a comma-separated list such as `1000,250,100,25`.
pub fn list<T: std::str::FromStr>(text: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        out.push(
            part.parse::<T>()
                .map_err(|e| anyhow!("bad list element {part:?}: {e}"))?,
        );
    }
    if out.is_empty() {
        return Err(anyhow!("empty list {text:?}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sac_line() {
        let out =
            "some noise\nchecksum=200115000000 seconds=0.016668 pairs=400000 mode=malloc x=25\n";
        let l = ResultLine::find_in(out).unwrap();
        assert_eq!(l.checksum().unwrap(), 200_115_000_000);
        assert!((l.seconds().unwrap() - 0.016668).abs() < 1e-12);
        assert_eq!(l.require::<u64>("pairs").unwrap(), 400_000);
        assert_eq!(l.get("mode"), Some("malloc"));
        assert_eq!(l.get("nope"), None);
    }

    #[test]
    fn takes_the_last_result_line() {
        let out = "checksum=1 seconds=1\nchecksum=2 seconds=2\ntrailing words\n";
        assert_eq!(ResultLine::find_in(out).unwrap().checksum().unwrap(), 2);
    }

    #[test]
    fn rejects_missing_and_bad_fields() {
        assert!(ResultLine::find_in("nothing here\n").is_err());
        let l = ResultLine::parse("checksum=abc seconds=-1 x=").unwrap();
        assert!(l.checksum().is_err());
        assert!(l.seconds().is_err());
        assert_eq!(l.get("x"), Some(""));
        assert!(ResultLine::parse("=5").is_err());
        // A checksum above i64::MAX is still valid.
        let l = ResultLine::parse("checksum=16700675956804326206 seconds=0.5").unwrap();
        assert_eq!(l.checksum().unwrap(), 16_700_675_956_804_326_206);
    }

    #[test]
    fn callgrind_totals_line() {
        let text = "version: 1\ncreator: callgrind-3.19.0\npid: 4242\ncmd: ./sac malloc 25 1000 1 1\n\
                    positions: line\nevents: Ir\nsummary: 999\n\nfl=(1) sac.c\nfn=(1) main\n12 5\n\ntotals: 1234567\n";
        assert_eq!(callgrind_total_ir(text).unwrap(), 1_234_567);
    }

    #[test]
    fn callgrind_summary_only_and_other_events() {
        assert_eq!(callgrind_total_ir("events: Ir\nsummary: 42\n").unwrap(), 42);
        let text = "events: Dr Ir Dw\ntotals: 10 20 30\n";
        assert_eq!(callgrind_total_ir(text).unwrap(), 20);
        assert!(callgrind_total_ir("events: Ir\n").is_err());
        assert!(callgrind_total_ir("events: Ir\ntotals: many\n").is_err());
    }

    #[test]
    fn lists() {
        assert_eq!(
            list::<u32>("1000, 250,100,25").unwrap(),
            vec![1000, 250, 100, 25]
        );
        assert_eq!(
            list::<String>("glibc,canopy").unwrap(),
            vec!["glibc".to_string(), "canopy".to_string()]
        );
        assert!(list::<u32>("").is_err());
        assert!(list::<u32>("1,x").is_err());
    }
}
