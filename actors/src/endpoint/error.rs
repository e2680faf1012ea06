//! The one shape every refusal has: an OpenAI error object with its HTTP status.

use serde_json::{json, Value};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with a status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What is wrong and what is allowed.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, where there is one.
    pub param: Option<String>,
    /// A short machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for what is not served.
    pub fn invalid(message: impl Into<String>, param: Option<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// 401: no episode in flight has this API key.
    pub fn unknown_episode(message: impl Into<String>) -> Self {
        Self::unauthorized(message)
    }

    /// 401: the request lacks the credential the endpoint wants.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: 401,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404: no such route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: 404,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: 413,
            message: format!("the request body is over {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 429: more requests at once than allowed.
    pub fn too_many(message: impl Into<String>) -> Self {
        Self {
            status: 429,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("too_many_requests"),
        }
    }

    /// 504: the request ran past its deadline.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self {
            status: 504,
            message: message.into(),
            kind: "timeout_error",
            param: None,
            code: Some("timeout"),
        }
    }

    /// 500: the engine failed or the episode ended under the request.
    pub fn server(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The error object.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}
