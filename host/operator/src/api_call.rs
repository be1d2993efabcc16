//! The commands that call a running operator's API: `probe` (the chart's
//! `helm test` hook) and `plugin rollback`, and the token file they share.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

/// The first token in `file`, a token file as the API reads it.
pub fn read_token(file: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--api-token-file {}: cannot read it", file.display()))?;
    Ok(proxyfleet_fleet::auth::first_token(&text)
        .with_context(|| format!("--api-token-file {}: holds no token", file.display()))?
        .to_owned())
}

/// GETs each of `paths` from the API at `api`, prints a line per answer,
/// and fails naming every path that did not answer 2xx.
pub async fn probe(
    api: &str,
    paths: &[String],
    token_file: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let token = token_file.map(read_token).transpose()?;
    let mut failed = Vec::new();
    for path in paths {
        let (status, body) =
            proxyfleet_fleet::client::call(api, http::Method::GET, path, None, token.as_deref())
                .await
                .map_err(|err| anyhow::anyhow!("--api {api}: {err}"))?;
        let ok = (200..300).contains(&status);
        crate::print_text(&format!("GET {path}: {status}{}\n", summary(&body)));
        if !ok {
            failed.push(format!("{path} answered {status}: {}", body.trim()));
        }
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(ExitCode::SUCCESS)
}

/// A short word on a JSON answer: how many items a list holds.
fn summary(body: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Array(items)) => format!(" ({} items)", items.len()),
        Ok(serde_json::Value::Object(map)) => match map.get("items").or_else(|| map.get("proxies"))
        {
            Some(serde_json::Value::Array(items)) => format!(" ({} items)", items.len()),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// Brings back an entry's previous plugin revision through the API.
pub async fn rollback(
    entry: &str,
    api: &str,
    token_file: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let token = token_file.map(read_token).transpose()?;
    let path = format!("/v1/providers/{entry}/rollback");
    let (status, body) =
        proxyfleet_fleet::client::call(api, http::Method::POST, &path, None, token.as_deref())
            .await
            .map_err(|err| anyhow::anyhow!("--api {api}: {err}"))?;
    crate::print_text(&format!("{body}\n"));
    Ok(if status == 200 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_token_line_is_used_and_an_empty_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# crawlers\n\n  first-token role=read \nsecond\n").unwrap();
        assert_eq!(read_token(&file).unwrap(), "first-token", "without its role");
        std::fs::write(&file, "# none\n").unwrap();
        let err = read_token(&file).unwrap_err().to_string();
        assert!(err.contains("holds no token"), "{err}");
    }

    #[test]
    fn a_list_answer_is_summed_up() {
        assert_eq!(summary("[1,2]"), " (2 items)");
        assert_eq!(summary(r#"{"items":[{}]}"#), " (1 items)");
        assert_eq!(summary("ok"), "");
    }
}
