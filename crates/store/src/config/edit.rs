//! Changes to the config document (SPEC 13), as edits of its TOML with `toml_edit`:
//! comments, order and formatting of everything not changed stay byte for byte. An
//! edit only rewrites the text; whether the result is a valid configuration is the
//! ordinary validation's to say (the caller validates the new text exactly like a file
//! load, and applies it whole or not at all).
//!
//! Entities: `[[accounts]]` and `[[keys]]` by `id` (unique in the file), `[[groups]]`
//! by `org` and `id`, `[[urls]]` by `org` and `custom_url`. Fields come as JSON (the
//! admin API's bodies): strings, numbers, booleans, arrays and objects (inline tables);
//! `null` in a change removes the field.

use serde_json::Value;
/// The editable document (re-exported so that callers need no `toml_edit` of their own).
pub use toml_edit::DocumentMut;
use toml_edit::{Array, ArrayOfTables, InlineTable, Item, Table};

/// What a change is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    /// `[[accounts]]`.
    Account,
    /// `[[groups]]`.
    Group,
    /// `[[urls]]`.
    Url,
    /// `[[keys]]`.
    Key,
}

impl Entity {
    /// The section's name.
    pub fn section(self) -> &'static str {
        match self {
            Self::Account => "accounts",
            Self::Group => "groups",
            Self::Url => "urls",
            Self::Key => "keys",
        }
    }

    /// The field that names an element.
    pub fn id_field(self) -> &'static str {
        match self {
            Self::Url => "custom_url",
            _ => "id",
        }
    }

    /// Whether its ids are unique within an org only.
    pub fn per_org(self) -> bool {
        matches!(self, Self::Group | Self::Url)
    }

    /// `account`, `group`, …
    pub fn noun(self) -> &'static str {
        match self {
            Self::Account => "account",
            Self::Group => "group",
            Self::Url => "URL config",
            Self::Key => "key",
        }
    }
}

/// Which element: its id and, for groups and URL configs, its org.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The entity.
    pub entity: Entity,
    /// Its org (groups and URL configs).
    pub org: Option<String>,
    /// Its id (`custom_url` of a URL config).
    pub id: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.org {
            Some(org) => write!(f, "{} {org}/{}", self.entity.noun(), self.id),
            None => write!(f, "{} {}", self.entity.noun(), self.id),
        }
    }
}

/// Why an edit could not be made (before any validation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The document is not TOML keypool can edit.
    #[error("the config document does not parse: {0}")]
    Parse(String),
    /// No such element.
    #[error("no {0}")]
    NotFound(String),
    /// The element exists already.
    #[error("{0} exists already")]
    Exists(String),
    /// The body is not what the route takes.
    #[error("{0}")]
    Body(String),
}

/// Parses a config document for editing.
///
/// # Errors
/// [`EditError::Parse`].
pub fn parse(text: &str) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>()
        .map_err(|e| EditError::Parse(e.to_string()))
}

/// A JSON value as a TOML value; `None` for `null`.
fn value_of(v: &Value) -> Result<Option<toml_edit::Value>, EditError> {
    Ok(Some(match v {
        Value::Null => return Ok(None),
        Value::Bool(b) => (*b).into(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.into(),
            (None, Some(f)) => f.into(),
            _ => {
                return Err(EditError::Body(format!(
                    "{n} is not a number TOML can hold"
                )));
            }
        },
        Value::String(s) => s.as_str().into(),
        Value::Array(items) => {
            let mut array = Array::new();
            for item in items {
                match value_of(item)? {
                    Some(v) => array.push(v),
                    None => return Err(EditError::Body("an array cannot hold null".into())),
                }
            }
            toml_edit::Value::Array(array)
        }
        Value::Object(map) => {
            let mut table = InlineTable::new();
            for (k, v) in map {
                if let Some(v) = value_of(v)? {
                    table.insert(k, v);
                }
            }
            toml_edit::Value::InlineTable(table)
        }
    }))
}

fn elements<'d>(
    doc: &'d mut DocumentMut,
    section: &str,
) -> Result<&'d mut ArrayOfTables, EditError> {
    if !doc.contains_key(section) {
        doc.insert(section, Item::ArrayOfTables(ArrayOfTables::new()));
    }
    doc[section].as_array_of_tables_mut().ok_or_else(|| {
        EditError::Parse(format!(
            "`{section}` is not an array of tables ([[{section}]]); keypool can only edit that form"
        ))
    })
}

fn str_field<'t>(table: &'t Table, field: &str) -> Option<&'t str> {
    table.get(field).and_then(Item::as_str)
}

fn matches(table: &Table, target: &Target) -> bool {
    str_field(table, target.entity.id_field()) == Some(target.id.as_str())
        && (!target.entity.per_org() || str_field(table, "org") == target.org.as_deref())
}

fn position(doc: &mut DocumentMut, target: &Target) -> Result<Option<usize>, EditError> {
    Ok(elements(doc, target.entity.section())?
        .iter()
        .position(|t| matches(t, target)))
}

/// Sets `fields` on `table` (`null` removes), keeping the others and their order.
fn set_fields<'f>(
    table: &mut Table,
    fields: impl IntoIterator<Item = (&'f String, &'f Value)>,
) -> Result<(), EditError> {
    for (name, value) in fields {
        match value_of(value)? {
            Some(v) => {
                let decor = table
                    .get(name)
                    .and_then(Item::as_value)
                    .map(|old| old.decor().clone());
                let mut v = v;
                if let Some(decor) = decor {
                    *v.decor_mut() = decor;
                }
                table.insert(name, Item::Value(v));
            }
            None => {
                table.remove(name);
            }
        }
    }
    Ok(())
}

/// Appends a new element of `entity` with `fields` (which must name it).
///
/// # Errors
/// [`EditError::Body`] when the fields do not name it, [`EditError::Exists`] when an
/// element of that name exists.
pub fn create(
    doc: &mut DocumentMut,
    entity: Entity,
    fields: &serde_json::Map<String, Value>,
) -> Result<Target, EditError> {
    let id_field = entity.id_field();
    let id = fields
        .get(id_field)
        .and_then(Value::as_str)
        .ok_or_else(|| {
            EditError::Body(format!(
                "a new {} needs `{id_field}` (a string)",
                entity.noun()
            ))
        })?;
    let org = fields.get("org").and_then(Value::as_str).map(str::to_owned);
    let target = Target {
        entity,
        org: if entity.per_org() { org } else { None },
        id: id.to_owned(),
    };
    if position(doc, &target)?.is_some() {
        return Err(EditError::Exists(target.to_string()));
    }
    let mut table = Table::new();
    // The name first, then org, then the rest (by name).
    let first = [id_field, "org"];
    let ordered = first
        .iter()
        .filter_map(|f| fields.get_key_value(*f))
        .chain(fields.iter().filter(|(k, _)| !first.contains(&k.as_str())));
    set_fields(&mut table, ordered)?;
    // After the section's last element (toml_edit keeps an array of tables together).
    elements(doc, entity.section())?.push(table);
    Ok(target)
}

/// Changes `fields` of an element (`null` removes a field). Its name and org cannot
/// change (delete it and create another).
///
/// # Errors
/// [`EditError::NotFound`], or [`EditError::Body`] for a rename.
pub fn change(
    doc: &mut DocumentMut,
    target: &Target,
    fields: &serde_json::Map<String, Value>,
) -> Result<(), EditError> {
    for fixed in [target.entity.id_field(), "org"] {
        if let Some(v) = fields.get(fixed) {
            let current = if fixed == "org" {
                target.org.as_deref()
            } else {
                Some(target.id.as_str())
            };
            if current.is_some() && v.as_str() != current {
                return Err(EditError::Body(format!(
                    "`{fixed}` of a {} cannot change: delete it and create another",
                    target.entity.noun()
                )));
            }
        }
    }
    let i = position(doc, target)?.ok_or_else(|| EditError::NotFound(target.to_string()))?;
    let table = elements(doc, target.entity.section())?
        .get_mut(i)
        .ok_or_else(|| EditError::NotFound(target.to_string()))?;
    if !target.entity.per_org() && fields.contains_key("org") {
        // `org` of an account or key: the same rule (it was checked above only when
        // the target names its org).
        if fields.get("org").and_then(Value::as_str) != str_field(table, "org") {
            return Err(EditError::Body(format!(
                "`org` of a {} cannot change: delete it and create another",
                target.entity.noun()
            )));
        }
    }
    set_fields(table, fields)
}

/// Deletes an element. Deleting an account also takes it out of every group that
/// lists it (a group left empty is then the validation's to refuse).
///
/// # Errors
/// [`EditError::NotFound`].
pub fn delete(doc: &mut DocumentMut, target: &Target) -> Result<(), EditError> {
    let i = position(doc, target)?.ok_or_else(|| EditError::NotFound(target.to_string()))?;
    elements(doc, target.entity.section())?.remove(i);
    if target.entity == Entity::Account
        && let Some(groups) = doc.get_mut("groups").and_then(Item::as_array_of_tables_mut)
    {
        for group in groups.iter_mut() {
            if let Some(accounts) = group.get_mut("accounts").and_then(Item::as_array_mut) {
                let was_first =
                    accounts.get(0).and_then(toml_edit::Value::as_str) == Some(target.id.as_str());
                accounts.retain(|v| v.as_str() != Some(target.id.as_str()));
                // The new first element takes the old first's place (no `[ "a2"]`).
                if was_first && let Some(first) = accounts.get_mut(0) {
                    first.decor_mut().set_prefix("");
                }
            }
        }
    }
    Ok(())
}

/// The value of `field` of an element, if it is a string.
pub fn field(doc: &mut DocumentMut, target: &Target, field: &str) -> Option<String> {
    let i = position(doc, target).ok()??;
    let table = elements(doc, target.entity.section()).ok()?.get(i)?;
    str_field(table, field).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DOC: &str = "# the team's pool\n[[orgs]]\nslug = \"acme\"\n\n[[accounts]]\nid = \"a1\"   # first\norg = \"acme\"\nweight = 2 # heavier\n\n[[groups]]\nid = \"g\"\norg = \"acme\"\naccounts = [\"a1\", \"a2\"]\n";

    fn fields(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn account(id: &str) -> Target {
        Target {
            entity: Entity::Account,
            org: None,
            id: id.into(),
        }
    }

    #[test]
    fn a_change_touches_only_its_value_and_keeps_comments() {
        let mut doc = parse(DOC).unwrap();
        change(&mut doc, &account("a1"), &fields(json!({"weight": 5}))).unwrap();
        assert_eq!(doc.to_string(), DOC.replace("weight = 2 #", "weight = 5 #"));
        change(&mut doc, &account("a1"), &fields(json!({"weight": null}))).unwrap();
        assert!(!doc.to_string().contains("weight"));
        assert!(doc.to_string().starts_with("# the team's pool\n"));
    }

    #[test]
    fn create_appends_and_refuses_a_duplicate_and_delete_leaves_the_groups() {
        let mut doc = parse(DOC).unwrap();
        let body = fields(
            json!({"org": "acme", "id": "a2", "provider": "anthropic", "limits": {"usd_per_day": 5.0}}),
        );
        create(&mut doc, Entity::Account, &body).unwrap();
        let text = doc.to_string();
        // Beside the other accounts, the rest untouched.
        assert_eq!(
            text,
            DOC.replace(
                "\n[[groups]]",
                "\n[[accounts]]\nid = \"a2\"\norg = \"acme\"\nlimits = { usd_per_day = 5.0 }\nprovider = \"anthropic\"\n\n[[groups]]"
            )
        );
        assert_eq!(
            create(&mut doc, Entity::Account, &body),
            Err(EditError::Exists("account a2".into()))
        );
        delete(&mut doc, &account("a1")).unwrap();
        let text = doc.to_string();
        assert!(!text.contains("id = \"a1\""));
        assert!(text.contains("accounts = [\"a2\"]"), "{text}");
        assert_eq!(
            delete(&mut doc, &account("a1")),
            Err(EditError::NotFound("account a1".into()))
        );
    }

    #[test]
    fn names_and_orgs_do_not_change() {
        let mut doc = parse(DOC).unwrap();
        let e = change(&mut doc, &account("a1"), &fields(json!({"id": "b"}))).unwrap_err();
        assert!(matches!(e, EditError::Body(_)), "{e:?}");
        let e = change(&mut doc, &account("a1"), &fields(json!({"org": "other"}))).unwrap_err();
        assert!(matches!(e, EditError::Body(_)), "{e:?}");
        let group = Target {
            entity: Entity::Group,
            org: Some("acme".into()),
            id: "g".into(),
        };
        change(&mut doc, &group, &fields(json!({"strategy": "priority"}))).unwrap();
        assert!(doc.to_string().contains("strategy = \"priority\""));
    }
}
