//! The Prometheus text format as the observability suite reads it: the families of a
//! scrape ([`Scrape::parse`]), the naming rules every family must follow
//! ([`naming_problems`]) and the metric names a PromQL expression refers to
//! ([`metric_names_in`]).
//!
//! The rules are Prometheus' own (<https://prometheus.io/docs/practices/naming/>): one
//! application prefix, snake case, base units only (seconds, bytes, ratio) and as the
//! last word, `_total` on counters and only on counters, no reserved suffix on a
//! histogram's name.

use std::collections::{BTreeMap, BTreeSet};

/// One sample: its name (a family name, or `<histogram>_bucket|_sum|_count`), labels
/// and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// One metric family: its `TYPE`, whether it has a `HELP`, its samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, …
    pub kind: String,
    /// Whether a `# HELP` line came with it.
    pub help: bool,
    /// Its samples, in order.
    pub samples: Vec<Sample>,
}

/// A whole scrape, by family name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// The families.
    pub families: BTreeMap<String, Family>,
}

impl Scrape {
    /// Parses a text exposition.
    ///
    /// # Errors
    /// A line that is not a comment, a `TYPE`/`HELP` or a sample of a declared family,
    /// a family declared twice, a histogram sample without its suffix.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        let mut help: BTreeSet<String> = BTreeSet::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or("");
                if !help.insert(name.to_owned()) {
                    return Err(format!("two HELP lines for {name}"));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .ok_or(format!("bad TYPE line {line:?}"))?;
                if families.contains_key(name) {
                    return Err(format!("{name} declared twice"));
                }
                families.insert(
                    name.to_owned(),
                    Family {
                        kind: kind.trim().to_owned(),
                        ..Family::default()
                    },
                );
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let sample = parse_sample(line)?;
            let family = family_of(&sample.name, &families)
                .ok_or(format!("sample {:?} of no declared family", sample.name))?;
            families
                .get_mut(&family)
                .map(|f| f.samples.push(sample))
                .ok_or("unreachable")?;
        }
        for (name, family) in &mut families {
            family.help = help.contains(name);
        }
        Ok(Self { families })
    }

    /// Whether `name` is a family or a histogram's `_bucket`/`_sum`/`_count` series:
    /// what a query may name.
    pub fn exports(&self, name: &str) -> bool {
        family_of(name, &self.families).is_some()
    }

    /// Every value of label `label` across all families.
    pub fn label_values(&self, label: &str) -> BTreeSet<String> {
        self.families
            .values()
            .flat_map(|f| &f.samples)
            .filter_map(|s| s.labels.get(label).cloned())
            .collect()
    }
}

/// The family a sample belongs to: its own name, or a histogram's name for its
/// `_bucket`, `_sum` and `_count` series.
fn family_of(sample: &str, families: &BTreeMap<String, Family>) -> Option<String> {
    if let Some(f) = families.get(sample)
        && f.kind != "histogram"
    {
        return Some(sample.to_owned());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = sample.strip_suffix(suffix)?;
        families
            .get(base)
            .is_some_and(|f| f.kind == "histogram")
            .then(|| base.to_owned())
    })
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let bad = || format!("bad sample line {line:?}");
    let (name, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}').ok_or_else(bad)?;
            (&line[..open], (&line[open + 1..close], &line[close + 1..]))
        }
        None => {
            let (name, value) = line.split_once(' ').ok_or_else(bad)?;
            (name, ("", value))
        }
    };
    let (labels_text, value) = rest;
    let value: f64 = value.trim().parse().map_err(|_| bad())?;
    let mut labels = BTreeMap::new();
    let mut text = labels_text;
    while !text.is_empty() {
        let (key, after) = text.split_once("=\"").ok_or_else(bad)?;
        // the value ends at the first quote not escaped by a backslash
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end.ok_or_else(bad)?;
        labels.insert(
            key.trim_start_matches(',').to_owned(),
            after[..end].to_owned(),
        );
        text = after[end + 1..].trim_start_matches(',');
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Units a name must not use: keypool speaks seconds, bytes and ratios.
const NON_BASE_UNITS: [&str; 19] = [
    "ms",
    "millis",
    "milliseconds",
    "us",
    "microseconds",
    "ns",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "kb",
    "kib",
    "mb",
    "mib",
    "gb",
    "kilobytes",
    "megabytes",
    "percent",
    "pct",
];

/// Words that say a value is a time, a size or a fraction: its name must end with that
/// base unit (`_seconds`, `_bytes`, `_ratio`; before `_total` on a counter).
const UNIT_WORDS: [(&str, &str); 11] = [
    ("duration", "seconds"),
    ("latency", "seconds"),
    ("ttft", "seconds"),
    ("timestamp", "seconds"),
    ("uptime", "seconds"),
    ("elapsed", "seconds"),
    ("memory", "bytes"),
    ("size", "bytes"),
    ("utilization", "ratio"),
    ("utilisation", "ratio"),
    ("fraction", "ratio"),
];

/// Every way the families of `scrape` break the naming rules (empty: none).
pub fn naming_problems(scrape: &Scrape, prefixes: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, family) in &scrape.families {
        let mut problem = |what: String| problems.push(format!("{name}: {what}"));
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            || name.starts_with('_')
            || name.contains("__")
        {
            problem("not snake case (a-z, 0-9, _; colons are for recording rules)".into());
        }
        if !prefixes.iter().any(|p| name.starts_with(p)) {
            problem(format!("no prefix of {prefixes:?}"));
        }
        if !family.help {
            problem("no HELP".into());
        }
        let counter = family.kind == "counter";
        if counter != name.ends_with("_total") {
            problem(format!(
                "a {} {} end in _total",
                family.kind,
                if counter { "must" } else { "must not" }
            ));
        }
        if family.kind == "histogram"
            && ["_bucket", "_sum", "_count", "_total"]
                .iter()
                .any(|s| name.ends_with(s))
        {
            problem("a histogram's name ends with a reserved suffix".into());
        }
        let words: Vec<&str> = name
            .strip_suffix("_total")
            .unwrap_or(name)
            .split('_')
            .collect();
        for word in &words {
            if NON_BASE_UNITS.contains(word) {
                problem(format!(
                    "`{word}` is not a base unit (seconds, bytes, ratio)"
                ));
            }
        }
        let last = words.last().copied().unwrap_or("");
        for (i, word) in words.iter().enumerate() {
            let base = matches!(*word, "seconds" | "bytes" | "ratio");
            if base && i + 1 != words.len() {
                problem(format!("the unit `{word}` is not the last word"));
            }
        }
        for (word, unit) in UNIT_WORDS {
            if words.contains(&word) && last != unit {
                problem(format!(
                    "`{word}` is measured in {unit}: end the name with _{unit}"
                ));
            }
        }
        if name.ends_with("_info")
            && (family.kind != "gauge" || family.samples.iter().any(|s| s.value != 1.0))
        {
            problem("an _info metric is a gauge of value 1".into());
        }
        for sample in &family.samples {
            for label in sample.labels.keys() {
                let histogram_le = label == "le" && family.kind == "histogram";
                if label.starts_with("__")
                    || !label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    || (label == "le" && !histogram_le)
                {
                    problems.push(format!("{name}: label `{label}` is not a valid label name"));
                }
            }
        }
    }
    problems
}

/// The metric names an expression refers to: identifiers starting with one of
/// `prefixes` outside strings and label matchers, that are not called as functions.
pub fn metric_names_in(expr: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut depth_braces = 0usize;
    let mut in_string = None::<char>;
    let bytes: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(quote) = in_string {
            if c == '\\' {
                i += 1;
            } else if c == quote {
                in_string = None;
            }
            i += 1;
            continue;
        }
        match c {
            '"' | '\'' | '`' => in_string = Some(c),
            '{' => depth_braces += 1,
            '}' => depth_braces = depth_braces.saturating_sub(1),
            c if (c.is_ascii_alphabetic() || c == '_') && depth_braces == 0 => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '_' || bytes[i] == ':')
                {
                    i += 1;
                }
                let word: String = bytes[start..i].iter().collect();
                let called = bytes[i..].iter().find(|c| !c.is_whitespace()) == Some(&'(');
                if !called && prefixes.iter().any(|p| word.starts_with(p)) {
                    names.insert(word);
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP a_requests_total R.\n# TYPE a_requests_total counter\na_requests_total{status=\"200\"} 3\n# HELP a_latency_seconds L.\n# TYPE a_latency_seconds histogram\na_latency_seconds_bucket{le=\"1\"} 1\na_latency_seconds_bucket{le=\"+Inf\"} 1\na_latency_seconds_sum 0.5\na_latency_seconds_count 1\n";

    #[test]
    fn a_good_scrape_parses_and_passes() {
        let scrape = Scrape::parse(GOOD).unwrap();
        assert_eq!(scrape.families["a_latency_seconds"].samples.len(), 4);
        assert!(scrape.exports("a_latency_seconds_bucket"));
        assert!(!scrape.exports("a_requests_total_bucket"));
        assert_eq!(naming_problems(&scrape, &["a_"]), Vec::<String>::new());
    }

    #[test]
    fn bad_names_are_found() {
        let bad = "# HELP a_wait_ms W.\n# TYPE a_wait_ms gauge\na_wait_ms 1\n# TYPE a_hits counter\na_hits 2\n# HELP a_bytes_in_flight B.\n# TYPE a_bytes_in_flight gauge\na_bytes_in_flight 0\n# HELP a_queue_total Q.\n# TYPE a_queue_total gauge\na_queue_total 1\n# HELP a_window_utilization W.\n# TYPE a_window_utilization gauge\na_window_utilization 0.5\n";
        let problems = naming_problems(&Scrape::parse(bad).unwrap(), &["a_"]);
        for expected in [
            "a_wait_ms: `ms` is not a base unit",
            "a_hits: no HELP",
            "a_hits: a counter must end in _total",
            "a_bytes_in_flight: the unit `bytes` is not the last word",
            "a_queue_total: a gauge must not end in _total",
            "a_window_utilization: `utilization` is measured in ratio",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{expected}: {problems:?}"
            );
        }
        assert!(Scrape::parse("orphan 1\n").is_err());
    }

    #[test]
    fn names_in_expressions_skip_functions_labels_and_strings() {
        let expr = r#"sum by (account) (rate(keypool_a_total{status=~"keypool_x"}[5m])) / histogram_quantile(0.9, keypool_b_seconds_bucket) > on(x) keypool_c"#;
        let names: Vec<String> = metric_names_in(expr, &["keypool_"]).into_iter().collect();
        assert_eq!(
            names,
            ["keypool_a_total", "keypool_b_seconds_bucket", "keypool_c"]
        );
    }
}
