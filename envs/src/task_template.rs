//! Text rendered from a task's fields by a template with `{field}` placeholders: the
//! asymmetric critic's prefix (`[critic] prefix`), which may show what the policy must not
//! see (the gold answer, a reference solution in the task's `extra`).
//!
//! Fields: `{id}`, `{data_source}`, `{question}`, `{answer}` (the first gold answer),
//! `{answers}` (all of them, joined by ` | `), and `{extra.KEY}` for a key of the task's
//! `extra` object (a string as it is, anything else as JSON). `{{` and `}}` are literal
//! braces.

use crate::task::Task;

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field(Field),
}

/// A placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Id,
    DataSource,
    Question,
    Answer,
    Answers,
    Extra(String),
}

/// A template checked once: every placeholder names a field a task can have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskTemplate {
    pieces: Vec<Piece>,
}

/// What the fields are, for error messages.
const FIELDS: &str = "{id}, {data_source}, {question}, {answer}, {answers}, {extra.KEY}";

impl TaskTemplate {
    /// Parses `text`; the error says what is wrong and where (a character offset).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let closed = loop {
                        match chars.next() {
                            Some((_, '}')) => break true,
                            Some((_, c)) => name.push(c),
                            None => break false,
                        }
                    };
                    if !closed {
                        return Err(format!(
                            "`{{` at character {at} is not closed (write `{{{{` for a brace)"
                        ));
                    }
                    let field = match name.as_str() {
                        "id" => Field::Id,
                        "data_source" => Field::DataSource,
                        "question" => Field::Question,
                        "answer" => Field::Answer,
                        "answers" => Field::Answers,
                        other => match other.strip_prefix("extra.") {
                            Some(key) if !key.is_empty() => Field::Extra(key.to_string()),
                            _ => {
                                return Err(format!(
                                "unknown field `{{{name}}}` at character {at} (allowed: {FIELDS})"
                            ))
                            }
                        },
                    };
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Field(field));
                }
                '}' => {
                    return Err(format!(
                        "`}}` at character {at} closes nothing (write `}}}}` for a brace)"
                    ))
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Self { pieces })
    }

    /// The text for `task`; the error names the field the task lacks (an `extra` key it does
    /// not have, or `{answer}` with no gold answer).
    pub fn render(&self, task: &Task) -> Result<String, String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Field(Field::Id) => out.push_str(&task.id),
                Piece::Field(Field::DataSource) => out.push_str(&task.data_source),
                Piece::Field(Field::Question) => out.push_str(&task.question),
                Piece::Field(Field::Answer) => match task.answers.first() {
                    Some(a) => out.push_str(a),
                    None => return Err("`{answer}`: the task has no gold answer".into()),
                },
                Piece::Field(Field::Answers) => out.push_str(&task.answers.join(" | ")),
                Piece::Field(Field::Extra(key)) => match task.extra.get(key) {
                    Some(serde_json::Value::String(s)) => out.push_str(s),
                    Some(v) => out.push_str(&v.to_string()),
                    None => {
                        return Err(format!(
                            "`{{extra.{key}}}`: the task's extra has no `{key}`"
                        ))
                    }
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Task {
        Task {
            id: "q7".into(),
            data_source: "demo".into(),
            question: "Who wrote it?".into(),
            answers: vec!["Ann Lee".into(), "A. Lee".into()],
            prompt: None,
            extra: serde_json::json!({"solution": "search, then answer", "hops": 2}),
        }
    }

    #[test]
    fn renders_every_field_and_literal_braces() {
        let t = TaskTemplate::parse(
            "[{id}/{data_source}] {question} -> {answer} ({answers}); {extra.solution}, \
             {extra.hops} hops {{ok}}",
        )
        .unwrap();
        assert_eq!(
            t.render(&task()).unwrap(),
            "[q7/demo] Who wrote it? -> Ann Lee (Ann Lee | A. Lee); search, then answer, 2 hops {ok}"
        );
    }

    #[test]
    fn bad_templates_and_missing_fields_are_named() {
        for (text, want) in [
            ("{answr}", "unknown field `{answr}` at character 0"),
            ("x {extra.}", "unknown field `{extra.}`"),
            ("a {question", "not closed"),
            ("a } b", "closes nothing"),
        ] {
            let err = TaskTemplate::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
        let t = TaskTemplate::parse("{extra.reference}").unwrap();
        let err = t.render(&task()).unwrap_err();
        assert!(err.contains("no `reference`"), "{err}");
        let mut none = task();
        none.answers.clear();
        let err = TaskTemplate::parse("{answer}")
            .unwrap()
            .render(&none)
            .unwrap_err();
        assert!(err.contains("no gold answer"), "{err}");
    }
}
