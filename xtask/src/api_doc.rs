//! `docs/discovery-api.md`: the discovery API's OpenAPI file
//! (`docs/discovery-api.yaml`, which a test keeps in step with the routes)
//! as a page of the site, written by `cargo xtask render` and checked by
//! `--check` like the rendered manifests.

use std::fmt::Write as _;
use std::fs;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::Repo;

const SOURCE: &str = "docs/discovery-api.yaml";
const PAGE: &str = "docs/discovery-api.md";

/// Writes the page (or, checking, fails when it is stale).
pub fn sync(repo: &Repo, check: bool) -> Result<()> {
    let text =
        fs::read_to_string(repo.root.join(SOURCE)).with_context(|| format!("reading {SOURCE}"))?;
    let spec: Value =
        yaml_serde::from_str(&text).with_context(|| format!("{SOURCE} is not YAML"))?;
    let page = markdown(&spec);
    let path = repo.root.join(PAGE);
    if fs::read_to_string(&path).ok().as_deref() == Some(page.as_str()) {
        return Ok(());
    }
    ensure!(!check, "{PAGE} differs from {SOURCE} (run `cargo xtask render`)");
    fs::write(&path, page).with_context(|| format!("writing {PAGE}"))?;
    eprintln!("xtask render: wrote {PAGE}");
    Ok(())
}

/// The page for an OpenAPI 3 document: the description, each route with
/// its parameters, body and answers, then each schema as a table.
fn markdown(spec: &Value) -> String {
    let mut page = String::new();
    let title = spec["info"]["title"].as_str().unwrap_or("API");
    let _ = writeln!(page, "# The discovery API\n");
    let _ = writeln!(
        page,
        "Written from [`discovery-api.yaml`](discovery-api.yaml) (OpenAPI 3, \"{title}\") by \
         `cargo xtask render`; a test keeps that file in step with the routes the operator \
         serves. Guide: [Discovery and health](fleet-services.md#the-discovery-api).\n"
    );
    if let Some(description) = spec["info"]["description"].as_str() {
        let _ = writeln!(page, "{}\n", description.trim());
    }
    if let Some(server) = spec["servers"][0]["url"].as_str() {
        let _ = writeln!(page, "Default address: `{server}`.\n");
    }
    let _ = writeln!(page, "## Routes\n");
    let _ = writeln!(page, "| Method | Path | What | Token |\n| --- | --- | --- | --- |");
    let routes = routes(spec);
    for (method, path, operation) in &routes {
        let _ = writeln!(
            page,
            "| {} | [`{path}`](#{}) | {} | {} |",
            method.to_uppercase(),
            anchor(method, path),
            cell(operation["summary"].as_str().unwrap_or_default()),
            if needs_token(spec, operation) { "yes" } else { "no" }
        );
    }
    for (method, path, operation) in &routes {
        // In code: a heading ending in `{id}` would be read as attributes.
        let _ = writeln!(page, "\n### `{} {path}`\n", method.to_uppercase());
        if let Some(summary) = operation["summary"].as_str() {
            let _ = writeln!(page, "{summary}\n");
        }
        let parameters = parameters(spec, path, operation);
        if !parameters.is_empty() {
            let _ = writeln!(
                page,
                "| Parameter | In | Type | Description |\n| --- | --- | --- | --- |"
            );
            for parameter in parameters {
                let required =
                    if parameter["required"] == Value::Bool(true) { ", required" } else { "" };
                let _ = writeln!(
                    page,
                    "| `{}` | {}{required} | {} | {} |",
                    parameter["name"].as_str().unwrap_or_default(),
                    parameter["in"].as_str().unwrap_or_default(),
                    type_of(spec, &parameter["schema"]),
                    cell(parameter["description"].as_str().unwrap_or_default())
                );
            }
            page.push('\n');
        }
        if let Some(content) = operation["requestBody"]["content"].as_object() {
            for (media, body) in content {
                let _ = writeln!(page, "Body (`{media}`): {}\n", type_of(spec, &body["schema"]));
            }
        }
        if let Some(responses) = operation["responses"].as_object() {
            let _ = writeln!(page, "| Answer | Meaning | Body |\n| --- | --- | --- |");
            for (code, response) in responses {
                let bodies: Vec<String> = response["content"]
                    .as_object()
                    .map(|content| {
                        content
                            .iter()
                            .map(|(media, body)| {
                                format!("`{media}`: {}", type_of(spec, &body["schema"]))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let _ = writeln!(
                    page,
                    "| {code} | {} | {} |",
                    cell(response["description"].as_str().unwrap_or_default()),
                    cell(&bodies.join("; "))
                );
            }
        }
    }
    if let Some(schemas) = spec["components"]["schemas"].as_object() {
        let _ = writeln!(page, "\n## Objects");
        for (name, schema) in schemas {
            let _ = writeln!(page, "\n### {name}\n");
            object(&mut page, spec, schema);
        }
    }
    page
}

/// Every (method, path, operation), in the file's order.
fn routes(spec: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in spec["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                out.push((method.clone(), path.clone(), operation.clone()));
            }
        }
    }
    out
}

/// A route's parameters: the path item's, then the operation's, each
/// `$ref` followed.
fn parameters(spec: &Value, path: &str, operation: &Value) -> Vec<Value> {
    let shared = spec["paths"][path]["parameters"].as_array().cloned().unwrap_or_default();
    let own = operation["parameters"].as_array().cloned().unwrap_or_default();
    shared.into_iter().chain(own).map(|p| resolve(spec, &p).clone()).collect()
}

fn needs_token(spec: &Value, operation: &Value) -> bool {
    let security = if operation.get("security").is_some() {
        &operation["security"]
    } else {
        &spec["security"]
    };
    security.as_array().is_some_and(|s| !s.is_empty())
}

/// What a `$ref` names (the value itself when it is none).
fn resolve<'a>(spec: &'a Value, value: &'a Value) -> &'a Value {
    match value["$ref"].as_str().and_then(|r| r.strip_prefix("#/")) {
        Some(pointer) => spec.pointer(&format!("/{pointer}")).unwrap_or(value),
        None => value,
    }
}

/// A schema's type as a cell: a link to a named object, `array of …`,
/// an enum's values.
fn type_of(spec: &Value, schema: &Value) -> String {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap_or(reference);
        let target = resolve(spec, schema);
        return if target["type"] == "object" {
            format!("[{name}](#{})", name.to_lowercase())
        } else {
            type_of(spec, target)
        };
    }
    if let Some(all) = schema["allOf"].as_array().and_then(|all| all.first()) {
        return type_of(spec, all);
    }
    let mut text = match schema["type"].as_str() {
        Some("array") => format!("array of {}", type_of(spec, &schema["items"])),
        Some("object") if schema["properties"].is_object() => {
            let fields: Vec<String> = schema["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, field)| format!("`{name}`: {}", type_of(spec, field)))
                .collect();
            format!("object ({})", fields.join(", "))
        }
        Some("object") if schema["additionalProperties"].is_object() => {
            format!("map of {}", type_of(spec, &schema["additionalProperties"]))
        }
        Some(other) => other.to_owned(),
        None => "any".to_owned(),
    };
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("`{}`", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
            .collect();
        let _ = write!(text, ", one of {}", values.join(", "));
    }
    if let Some(default) = schema.get("default") {
        let _ = write!(
            text,
            ", default `{}`",
            default.as_str().map_or_else(|| default.to_string(), str::to_owned)
        );
    }
    if schema["nullable"] == Value::Bool(true) {
        text.push_str(", or null");
    }
    text
}

/// A named object's fields as a table, or its type for anything else.
fn object(page: &mut String, spec: &Value, schema: &Value) {
    let Some(properties) = schema["properties"].as_object() else {
        let _ = writeln!(page, "{}", type_of(spec, schema));
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if schema["additionalProperties"] == Value::Bool(false) {
        let _ = writeln!(page, "Unknown fields are refused by name.\n");
    }
    let _ = writeln!(page, "| Field | Type | Description |\n| --- | --- | --- |");
    for (name, field) in properties {
        let mut description = cell(field["description"].as_str().unwrap_or_default());
        if required.contains(&name.as_str()) {
            description = format!("**Required.** {description}").trim_end().to_owned();
        }
        let _ = writeln!(page, "| `{name}` | {} | {} |", cell(&type_of(spec, field)), description);
    }
}

/// The anchor mdBook and GitHub give the heading `METHOD path`.
fn anchor(method: &str, path: &str) -> String {
    format!("{method} {path}")
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

/// Text for one table cell.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Value {
        serde_json::json!({
            "info": { "title": "t", "description": "About." },
            "security": [{ "bearer": [] }],
            "components": {
                "parameters": { "id": { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } } },
                "schemas": {
                    "Lease": { "type": "object", "required": ["id"], "properties": {
                        "id": { "type": "string" },
                        "ttl": { "type": "integer", "description": "Seconds | at most." },
                    } },
                    "Kind": { "type": "string", "enum": ["a", "b"] },
                },
            },
            "paths": {
                "/healthz": { "get": { "summary": "Up.", "security": [], "responses": { "200": { "description": "ok" } } } },
                "/v1/leases/{id}": {
                    "parameters": [{ "$ref": "#/components/parameters/id" }],
                    "get": { "summary": "One.", "parameters": [{ "name": "kind", "in": "query", "schema": { "$ref": "#/components/schemas/Kind" } }],
                        "responses": { "200": { "description": "It.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Lease" } } } } } },
                },
            },
        })
    }

    #[test]
    fn routes_parameters_answers_and_objects_are_written() {
        let page = markdown(&spec());
        assert!(page.contains("| GET | [`/healthz`](#get-healthz) | Up. | no |"), "{page}");
        assert!(
            page.contains("| GET | [`/v1/leases/{id}`](#get-v1leasesid) | One. | yes |"),
            "{page}"
        );
        assert!(page.contains("| `id` | path, required | string |"), "{page}");
        assert!(page.contains("| `kind` | query | string, one of `a`, `b` |"), "{page}");
        assert!(page.contains("| 200 | It. | `application/json`: [Lease](#lease) |"), "{page}");
        assert!(page.contains("| `id` | string | **Required.** |"), "{page}");
        assert!(page.contains("Seconds \\| at most."), "a cell's bar is escaped: {page}");
    }

    #[test]
    fn anchors_are_the_headings_slugs() {
        assert_eq!(anchor("post", "/v1/proxies/{id}/report"), "post-v1proxiesidreport");
    }
}
