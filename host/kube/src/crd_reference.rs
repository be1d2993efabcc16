//! The CRD reference page (`docs/crd-reference.md`), written from the CRDs
//! themselves (`proxyfleet crd --reference`), so the page says what the
//! API server enforces: every field with its type, bounds, default and
//! description, the printer columns and the names kubectl knows.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

/// Which servers enforce a CEL rule (`crate::kube_version`).
const CEL_SINCE: &str = "a CEL rule: Kubernetes 1.25 and later";

/// The page for `crds`, in order.
pub fn markdown(crds: &[CustomResourceDefinition]) -> String {
    let mut page = String::from(
        "# Resource reference\n\n\
         Generated from the CustomResourceDefinitions by `proxyfleet crd --reference`; \
         the API server enforces every type, bound and pattern below and fills in the \
         defaults. Guides: [In a cluster](kubernetes.md#resources-proxyfleetiov1alpha1).\n",
    );
    for crd in crds {
        resource(&mut page, crd);
    }
    page
}

fn resource(page: &mut String, crd: &CustomResourceDefinition) {
    let names = &crd.spec.names;
    let Some(version) = crd.spec.versions.iter().find(|v| v.storage) else { return };
    let Some(schema) = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) else {
        return;
    };
    let _ = writeln!(page, "\n## {}\n", names.kind);
    if let Some(description) = &schema.description {
        let _ = writeln!(page, "{}\n", one_line(description));
    }
    let short = names.short_names.as_deref().unwrap_or_default();
    let categories = names.categories.as_deref().unwrap_or_default();
    let _ = writeln!(page, "| | |\n| --- | --- |");
    let _ = writeln!(page, "| API version | `{}/{}` |", crd.spec.group, version.name);
    let _ = writeln!(page, "| Scope | {} |", crd.spec.scope);
    let all_names: Vec<String> =
        std::iter::once(names.plural.clone()).chain(short.to_vec()).collect();
    let _ = writeln!(page, "| Names | {} |", code_list(&all_names));
    if !categories.is_empty() {
        let _ = writeln!(page, "| Categories | {} |", code_list(categories));
    }
    let subresources = version.subresources.as_ref();
    let mut served = Vec::new();
    if subresources.is_some_and(|s| s.status.is_some()) {
        served.push("`status`");
    }
    if subresources.is_some_and(|s| s.scale.is_some()) {
        served.push("`scale`");
    }
    if !served.is_empty() {
        let _ = writeln!(page, "| Subresources | {} |", served.join(", "));
    }
    if let Some(columns) = &version.additional_printer_columns {
        let _ = writeln!(page, "\n`kubectl get` columns (`-o wide` adds those of priority 1):\n");
        let _ = writeln!(page, "| Column | Priority | From |\n| --- | --- | --- |");
        for column in columns {
            let _ = writeln!(
                page,
                "| {} | {} | `{}` |",
                column.name,
                column.priority.unwrap_or(0),
                column.json_path.replace('|', "\\|")
            );
        }
    }
    for part in ["spec", "status"] {
        let Some(props) = schema.properties.as_ref().and_then(|p| p.get(part)) else { continue };
        let _ = writeln!(page, "\n### {} `{part}`\n", names.kind);
        if let Some(description) = &props.description {
            let _ = writeln!(page, "{}\n", one_line(description));
        }
        for rule in props.x_kubernetes_validations.as_deref().unwrap_or_default() {
            let field = rule.field_path.as_deref().unwrap_or_default();
            let message = rule.message.as_deref().unwrap_or(&rule.rule);
            let _ = writeln!(page, "- `{part}{field}` {} ({CEL_SINCE})", one_line(message));
        }
        if props.x_kubernetes_validations.as_ref().is_some_and(|rules| !rules.is_empty()) {
            page.push('\n');
        }
        let _ = writeln!(page, "| Field | Type | Description |\n| --- | --- | --- |");
        fields(page, part, props);
    }
}

/// One row per property under `schema`, depth first, paths from `path`.
fn fields(page: &mut String, path: &str, schema: &JSONSchemaProps) {
    let required = schema.required.as_deref().unwrap_or_default();
    let Some(properties) = &schema.properties else {
        if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
            fields(page, &format!("{path}[]"), items);
        }
        return;
    };
    for (name, child) in properties {
        let here = format!("{path}.{name}");
        let mut description = child.description.as_deref().map(one_line).unwrap_or_default();
        if required.iter().any(|r| r == name) {
            description = format!("**Required.** {description}");
        }
        for rule in child.x_kubernetes_validations.as_deref().unwrap_or_default() {
            let message = rule.message.as_deref().unwrap_or(&rule.rule);
            let _ = write!(description, " Refused: {} ({CEL_SINCE}).", one_line(message));
        }
        let _ = writeln!(page, "| `{here}` | {} | {} |", kind(child), escape(&description));
        fields(page, &here, child);
    }
}

/// The type with its bounds, pattern and default, as a table cell.
fn kind(schema: &JSONSchemaProps) -> String {
    let mut text = match (schema.type_.as_deref(), &schema.items) {
        (Some("array"), Some(JSONSchemaPropsOrArray::Schema(items))) => {
            format!("array of {}", items.type_.as_deref().unwrap_or("any"))
        }
        (Some("object"), _)
            if schema.properties.is_none() && schema.additional_properties.is_some() =>
        {
            "map of string".to_owned()
        }
        (Some(type_), _) => type_.to_owned(),
        (None, _) => "any".to_owned(),
    };
    // Integer widths (`uint32`, `int64`) say nothing a reader needs.
    if let Some(format) = schema.format.as_deref().filter(|f| !f.contains("int")) {
        let _ = write!(text, " ({format})");
    }
    let mut notes = Vec::new();
    match (schema.minimum, schema.maximum) {
        (Some(min), Some(max)) => notes.push(format!("{min}–{max}")),
        (Some(min), None) => notes.push(format!("≥ {min}")),
        (None, Some(max)) => notes.push(format!("≤ {max}")),
        (None, None) => {}
    }
    match (schema.min_length, schema.max_length) {
        (Some(min), Some(max)) => notes.push(format!("{min}–{max} characters")),
        (None, Some(max)) => notes.push(format!("up to {max} characters")),
        _ => {}
    }
    if let Some(values) = &schema.enum_ {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", v.0)).collect();
        notes.push(format!("one of {}", values.join(", ").replace('"', "")));
    }
    if let Some(pattern) = &schema.pattern {
        notes.push(format!("pattern `{pattern}`"));
    }
    if let Some(default) = &schema.default {
        let text = default.0.as_str().map_or_else(|| default.0.to_string(), str::to_owned);
        notes.push(format!("default `{text}`"));
    }
    if let Some(list) = schema.x_kubernetes_list_type.as_deref() {
        let keys = schema.x_kubernetes_list_map_keys.as_deref().unwrap_or_default();
        if keys.is_empty() {
            notes.push(format!("list type `{list}`"));
        } else {
            notes.push(format!("list type `{list}` keyed by `{}`", keys.join("`, `")));
        }
    }
    if notes.is_empty() { text } else { escape(&format!("{text}; {}", notes.join("; "))) }
}

fn code_list(items: &[String]) -> String {
    items.iter().map(|item| format!("`{item}`")).collect::<Vec<_>>().join(", ")
}

/// Doc comments wrap; a table cell is one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A cell's text with the table's separator escaped.
fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_every_kind_field_bound_and_default() {
        let page = markdown(&crate::crd::crds());
        for heading in
            ["## Proxy\n", "## ProxyPool\n", "## ClusterProxyProvider\n", "### Proxy `spec`"]
        {
            assert!(page.contains(heading), "{heading}");
        }
        assert!(page.contains("| `spec.cores` | integer; 1–256; default `1` |"), "{page}");
        assert!(page.contains("| `spec.provider` | string; 1–63 characters; pattern"), "{page}");
        assert!(page.contains("**Required.**"));
        assert!(
            page.contains(
                "| `status.conditions[].status` | string; one of `True`, `False`, `Unknown` |"
            ),
            "{page}"
        );
        assert!(page.contains("list type `map` keyed by `type`"));
        assert!(page.contains("| Categories | `proxyfleet` |"), "{page}");
    }

    #[test]
    fn a_table_cell_never_breaks_the_table() {
        assert_eq!(escape("a|b"), "a\\|b");
        assert_eq!(one_line("two\n   lines"), "two lines");
    }
}
