//! The pets resource: its types and the pure validation of what clients send.
//!
//! Validation is done by hand on a `serde_json::Value` rather than by serde derive, so that every
//! refusal names the field at fault in words a client understands and never echoes parser
//! internals.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::errors::ApiError;

/// Longest accepted `name`, in characters (Unicode scalar values).
pub const MAX_NAME_CHARS: usize = 100;
/// Largest page a client may ask for.
pub const MAX_LIMIT: u32 = 100;
/// Page size when the client does not say.
pub const DEFAULT_LIMIT: u32 = 20;

/// Availability of an animal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PetStatus {
    /// Can be bought.
    Available,
    /// Reserved, not yet sold.
    Pending,
    /// Sold.
    Sold,
}

impl PetStatus {
    /// Every status, in the spec's order.
    pub const ALL: [PetStatus; 3] = [PetStatus::Available, PetStatus::Pending, PetStatus::Sold];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PetStatus::Available => "available",
            PetStatus::Pending => "pending",
            PetStatus::Sold => "sold",
        }
    }

    /// Parses the wire spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<PetStatus> {
        PetStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// A validated request to create a pet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPet {
    /// 1 to 100 characters, not blank, no control characters.
    pub name: String,
    /// 1 to 2^63-1.
    pub category_id: i64,
    /// `available` when the client does not say.
    pub status: PetStatus,
}

/// A stored pet, as returned to clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pet {
    /// Assigned by the service: unique, increasing, never reused.
    pub id: i64,
    /// The animal's name.
    pub name: String,
    /// The category the animal belongs to.
    pub category_id: i64,
    /// Availability.
    pub status: PetStatus,
}

impl Pet {
    /// The pet that `new` becomes once it has an id.
    pub fn from_new(id: i64, new: NewPet) -> Pet {
        Pet {
            id,
            name: new.name,
            category_id: new.category_id,
            status: new.status,
        }
    }
}

/// Parses and validates a create body: JSON object with `name`, `categoryId`, optional `status`.
pub fn parse_new_pet(body: &[u8]) -> Result<NewPet, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_json(
            "the request body is empty; send a JSON object",
        ));
    }
    let body: Body = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid_json(format!(
            "the request body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let Body::Object(members) = body else {
        return Err(ApiError::invalid_json(
            "the request body must be a JSON object",
        ));
    };
    let mut object = Map::with_capacity(members.len());
    for (name, value) in members {
        if object.contains_key(&name) {
            return Err(ApiError::validation(format!(
                "field `{}` is given more than once",
                truncate_for_message(&name)
            )));
        }
        object.insert(name, value);
    }
    validate_new_pet(&object)
}

/// A request body as sent: an object's members in their order, duplicates kept (a `Value`
/// keeps only the last of them, so `{"name": "a", "name": "b"}` would pass as `b`; JSON leaves
/// duplicate names to each parser, and two parsers reading one body two ways is how checks are
/// slipped past), or any other JSON value.
enum Body {
    Object(Vec<(String, Value)>),
    Other,
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Body, D::Error> {
        deserializer.deserialize_any(BodyVisitor)
    }
}

struct BodyVisitor;

impl<'de> serde::de::Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0).min(16));
        while let Some(member) = map.next_entry::<String, Value>()? {
            members.push(member);
        }
        Ok(Body::Object(members))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Body, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Body::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Body, E> {
        Ok(Body::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Body, E> {
        Ok(Body::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Body, E> {
        Ok(Body::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Body, E> {
        Ok(Body::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<Body, E> {
        Ok(Body::Other)
    }

    fn visit_unit<E>(self) -> Result<Body, E> {
        Ok(Body::Other)
    }
}

/// How many unknown fields a refusal names; more are counted.
const UNKNOWN_FIELDS_NAMED: usize = 5;

fn validate_new_pet(object: &Map<String, Value>) -> Result<NewPet, ApiError> {
    let unknown: Vec<&String> = object
        .keys()
        .filter(|k| !matches!(k.as_str(), "name" | "categoryId" | "status"))
        .collect();
    if !unknown.is_empty() {
        // Every one of them, so that a client fixes its body once, not once per field.
        let mut named: Vec<String> = unknown
            .iter()
            .take(UNKNOWN_FIELDS_NAMED)
            .map(|k| format!("`{}`", truncate_for_message(k)))
            .collect();
        if unknown.len() > UNKNOWN_FIELDS_NAMED {
            named.push(format!("{} more", unknown.len() - UNKNOWN_FIELDS_NAMED));
        }
        let last = named.pop().expect("one unknown field at least");
        let list = if named.is_empty() {
            format!("field {last}")
        } else {
            format!("fields {} and {last}", named.join(", "))
        };
        return Err(ApiError::validation(format!(
            "unknown {list}; allowed fields are name, categoryId and status"
        )));
    }
    let name = match object.get("name") {
        None => return Err(ApiError::validation("`name` is required")),
        Some(Value::String(s)) => validate_name(s)?,
        Some(_) => return Err(ApiError::validation("`name` must be a string")),
    };
    let category_id = match object.get("categoryId") {
        None => return Err(ApiError::validation("`categoryId` is required")),
        Some(Value::Number(n)) => category_id(n)?,
        Some(_) => {
            return Err(ApiError::validation(
                "`categoryId` must be a JSON integer (not a string)",
            ));
        }
    };
    let status = match object.get("status") {
        None => PetStatus::Available,
        Some(Value::String(s)) => PetStatus::parse(s).ok_or_else(|| {
            ApiError::validation("`status` must be one of available, pending, sold")
        })?,
        Some(_) => {
            return Err(ApiError::validation(
                "`status` must be a string: available, pending or sold",
            ));
        }
    };
    Ok(NewPet {
        name,
        category_id,
        status,
    })
}

/// Largest integer a JSON number with a fraction part (`3.0`) can carry exactly.
const MAX_EXACT_FLOAT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// A category id from a JSON number. As in JSON Schema, which the published OpenAPI description
/// uses, `3.0` is the integer 3; `3.5` is not an integer, and a float too large to be exact is
/// refused rather than rounded.
fn category_id(n: &serde_json::Number) -> Result<i64, ApiError> {
    let out_of_range =
        || ApiError::validation("`categoryId` must be an integer from 1 to 9223372036854775807");
    if let Some(id) = n.as_i64() {
        return if id >= 1 { Ok(id) } else { Err(out_of_range()) };
    }
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() != 0.0 => Err(ApiError::validation(
            "`categoryId` must be an integer, not a fraction",
        )),
        Some(f) if n.is_f64() && (1.0..=MAX_EXACT_FLOAT_INTEGER).contains(&f) => Ok(f as i64),
        _ => Err(out_of_range()),
    }
}

fn validate_name(name: &str) -> Result<String, ApiError> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(ApiError::validation(format!(
            "`name` must be 1 to {MAX_NAME_CHARS} characters long (it has {chars})"
        )));
    }
    if name.chars().all(char::is_whitespace) {
        return Err(ApiError::validation("`name` must not be only white space"));
    }
    if name.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "`name` must not contain control characters",
        ));
    }
    Ok(name.to_owned())
}

/// Keeps client-supplied text short in error messages.
fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 40;
    let clean: String = s.chars().filter(|c| !c.is_control()).collect();
    if clean.chars().count() > MAX {
        format!("{}...", clean.chars().take(MAX).collect::<String>())
    } else {
        clean
    }
}

/// A validated list request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListQuery {
    /// Page size, 1 to 100.
    pub limit: u32,
    /// Only pets with this status.
    pub status: Option<PetStatus>,
    /// Only pets with an id greater than this (the last id of the previous page).
    pub after: Option<i64>,
}

/// Parses the list query string (`limit`, `status`, `cursor`); anything else is refused.
pub fn parse_list_query(raw: &str) -> Result<ListQuery, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|_| ApiError::invalid_parameter("the query string is not valid URL encoding"))?;
    let mut query = ListQuery {
        limit: DEFAULT_LIMIT,
        status: None,
        after: None,
    };
    let mut seen = [false; 3];
    for (name, value) in &pairs {
        let slot = match name.as_str() {
            "limit" => 0,
            "status" => 1,
            "cursor" => 2,
            other => {
                return Err(ApiError::invalid_parameter(format!(
                    "unknown query parameter `{}`; allowed are limit, status and cursor",
                    truncate_for_message(other)
                )));
            }
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err(ApiError::invalid_parameter(format!(
                "query parameter `{name}` is given more than once"
            )));
        }
        match slot {
            0 => query.limit = parse_limit(value)?,
            1 => {
                query.status = Some(PetStatus::parse(value).ok_or_else(|| {
                    ApiError::invalid_parameter("`status` must be one of available, pending, sold")
                })?)
            }
            _ => query.after = Some(decode_cursor(value)?),
        }
    }
    Ok(query)
}

fn parse_limit(value: &str) -> Result<u32, ApiError> {
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_LIMIT).contains(&n) && !value.starts_with('+') => Ok(n),
        _ => Err(ApiError::invalid_parameter(format!(
            "`limit` must be an integer from 1 to {MAX_LIMIT}"
        ))),
    }
}

/// Parses a pet id from a path segment: a decimal int64.
pub fn parse_pet_id(segment: &str) -> Result<i64, ApiError> {
    match segment.parse::<i64>() {
        Ok(id) if !segment.starts_with('+') => Ok(id),
        // Whether it is no integer or one beyond int64, the range says what would do.
        _ => Err(ApiError::invalid_parameter(format!(
            "`petId` must be an integer (int64), from {} to {}",
            i64::MIN,
            i64::MAX
        ))),
    }
}

/// The opaque cursor for "the page after the pet with this id".
///
/// It is the id in decimal: simple to debug, and the service promises nothing about its form.
pub fn encode_cursor(last_id: i64) -> String {
    last_id.to_string()
}

/// Reverses [`encode_cursor`]; anything else is a malformed parameter. A cursor past every id
/// a pet can have (the contract allows up to 19 digits) is read as the last one: the page
/// after it is empty, not an error.
pub fn decode_cursor(cursor: &str) -> Result<i64, ApiError> {
    match cursor.parse::<u64>() {
        Ok(id) if !cursor.starts_with('+') => Ok(i64::try_from(id).unwrap_or(i64::MAX)),
        _ => Err(ApiError::invalid_parameter(
            "`cursor` is malformed; use the link of the previous page",
        )),
    }
}

#[cfg(test)]
mod tests;
