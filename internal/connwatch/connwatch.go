package connwatch

import "errors"

// ErrUnsupported means the connection cannot be watched here; the caller
// proceeds without hang-up detection.
var ErrUnsupported = errors.New("connwatch: connection cannot be watched for hang-up")

// ErrClosed is returned by Watch after Close.
var ErrClosed = errors.New("connwatch: watcher closed")
