use super::*;

/// `(path, method, deprecated, open)` of every operation of the document.
fn operations(doc: &serde_json::Value) -> Vec<(String, String, bool, bool)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            out.push((
                path.clone(),
                method.clone(),
                operation["deprecated"] == true,
                operation["security"] == serde_json::json!([]),
            ));
        }
    }
    out
}

#[test]
fn every_api_route_is_under_v1_and_unprefixed_as_deprecated() {
    let doc = serde_json::to_value(openapi()).unwrap();
    let operations = operations(&doc);
    let probes = ["/", "/health", "/livez", "/readyz"];
    for (path, method, deprecated, open) in &operations {
        if probes.contains(&path.as_str()) {
            assert!(!deprecated && *open, "{method} {path}");
            continue;
        }
        let twin = match path.strip_prefix("/v1") {
            Some(unprefixed) => {
                assert!(!deprecated, "{method} {path}");
                unprefixed.to_string()
            }
            None => {
                assert!(
                    deprecated,
                    "{method} {path} is not under /v1 nor deprecated"
                );
                format!("/v1{path}")
            }
        };
        assert!(
            operations
                .iter()
                .any(|(p, m, _, o)| *p == twin && m == method && o == open),
            "{method} {path} has no twin {method} {twin}"
        );
        // Only the document itself is open among the API's routes.
        assert_eq!(*open, path.ends_with("/openapi.json"), "{method} {path}");
    }
    for (path, method) in [
        ("/v1/jobs", "post"),
        ("/v1/jobs/{id}", "delete"),
        ("/v1/jobs/{id}/savepoints", "post"),
        ("/v1/jobs/{id}/savepoints/{request_id}", "get"),
        ("/v1/jobs/{id}/savepoint", "post"),
        ("/v1/openapi.json", "get"),
    ] {
        assert!(
            operations.iter().any(|(p, m, ..)| p == path && m == method),
            "{method} {path} is not in the document"
        );
    }
    // Every schema an answer refers to is in the document.
    let text = doc.to_string();
    for reference in text.split("\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "no schema {name}"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}
