// Placeholder: being written (issue 15).
