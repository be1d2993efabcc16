//! What a run found: one case per rule, for people (`text`) and for CI
//! (`junit`, the JUnit XML that CI systems read).

use std::time::Duration;

use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The plugin kept the rule.
    Passed,
    /// It did not; what it did instead.
    Failed(String),
    /// Not tried: an earlier case it needs failed.
    Skipped(String),
}

/// One rule of the contract and how the plugin fared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// Short name, e.g. `create is idempotent per UID`.
    pub name: &'static str,
    /// The rule as `docs/plugin-contract.md` words it.
    pub rule: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub took: Duration,
}

/// Every case of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `name version (contract X)` of the plugin.
    pub plugin: String,
    /// The entry's name.
    pub entry: String,
    /// The cases in the order they ran.
    pub cases: Vec<Case>,
}

impl Report {
    /// Whether no case failed (skipped ones follow from failed ones).
    pub fn passed(&self) -> bool {
        !self.cases.iter().any(|case| matches!(case.outcome, Outcome::Failed(_)))
    }

    /// The report for people: one line a case, failures with their reason
    /// and the rule, and the totals.
    pub fn text(&self) -> String {
        let mut out = format!("conformance of {} as entry {}\n", self.plugin, self.entry);
        let mut counts = [0usize; 3];
        for case in &self.cases {
            let took = case.took.as_secs_f64();
            match &case.outcome {
                Outcome::Passed => {
                    counts[0] += 1;
                    out.push_str(&format!("  pass  {} ({took:.2} s)\n", case.name));
                }
                Outcome::Failed(why) => {
                    counts[1] += 1;
                    out.push_str(&format!(
                        "  FAIL  {} ({took:.2} s)\n        {why}\n        rule: {}\n",
                        case.name, case.rule
                    ));
                }
                Outcome::Skipped(why) => {
                    counts[2] += 1;
                    out.push_str(&format!("  skip  {}: {why}\n", case.name));
                }
            }
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} skipped\n",
            counts[0], counts[1], counts[2]
        ));
        out
    }

    /// The report as JUnit XML: one test suite, the entry; one test case a
    /// rule.
    pub fn junit(&self) -> String {
        let mut suite = TestSuite::new(format!("proxyfleet conformance: {}", self.entry));
        for case in &self.cases {
            let status = match &case.outcome {
                Outcome::Passed => TestCaseStatus::success(),
                Outcome::Failed(why) => {
                    let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    status.set_message(why.clone());
                    status.set_description(format!("rule: {}", case.rule));
                    status
                }
                Outcome::Skipped(why) => {
                    let mut status = TestCaseStatus::skipped();
                    status.set_message(why.clone());
                    status
                }
            };
            let mut test = TestCase::new(case.name, status);
            test.set_classname(self.plugin.clone());
            test.set_time(case.took);
            suite.add_test_case(test);
        }
        let mut report = quick_junit::Report::new("proxyfleet-conformance");
        report.add_test_suite(suite);
        // Serialising to a String writes to memory and cannot fail on I/O;
        // the text of its error is kept should it ever.
        report.to_string().unwrap_or_else(|err| format!("<!-- {err} -->"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let case = |name, outcome| Case { name, rule: "the rule", outcome, took: Duration::ZERO };
        Report {
            plugin: "demo 1.0.0 (contract 0.5.0)".into(),
            entry: "lab".into(),
            cases: vec![
                case("one", Outcome::Passed),
                case("two", Outcome::Failed("answered <twice> & more".into())),
                case("three", Outcome::Skipped("needs two".into())),
            ],
        }
    }

    #[test]
    fn text_names_failures_with_their_rule_and_counts() {
        let text = report().text();
        assert!(text.contains("  FAIL  two"), "{text}");
        assert!(text.contains("answered <twice> & more\n        rule: the rule"), "{text}");
        assert!(text.ends_with("1 passed, 1 failed, 1 skipped\n"), "{text}");
        assert!(!report().passed());
    }

    #[test]
    fn junit_has_one_case_a_rule_with_failures_escaped() {
        let xml = report().junit();
        assert!(xml.contains("tests=\"3\"") && xml.contains("failures=\"1\""), "{xml}");
        assert!(xml.contains("skipped=\"1\""), "{xml}");
        assert!(xml.contains("answered &lt;twice&gt; &amp; more"), "{xml}");
        assert!(xml.contains("name=\"proxyfleet conformance: lab\""), "{xml}");
    }
}
