package extauthz

// The tool walkers below read values the json.Decoder version skipped
// whole; each level they enter counts in s.depth, so that what they skip
// is refused past the same depth.

// tools counts tool definitions: a list of objects.
func (s *scanner[T]) tools() error {
	if s.data[s.i] != '[' {
		return s.jsonText()
	}
	return s.inArray(s.tool)
}

func (s *scanner[T]) tool() error {
	if s.data[s.i] != '{' {
		return s.jsonText()
	}
	return s.inObject(s.toolMember)
}

// toolMember counts a tool's member; a chat tool's function object's
// members count as the tool's own (one level: no recursion a body could
// deepen).
func (s *scanner[T]) toolMember(k token) error {
	name, err := s.field(k, toolKeys)
	if err != nil {
		return err
	}
	if name == "function" && s.data[s.i] == '{' {
		return s.inObject(s.toolField)
	}
	return s.toolField(k)
}

// toolField counts a member as its JSON text: the key in quotes, the
// colon, the value.
func (s *scanner[T]) toolField(k token) error {
	s.body.ToolChars += uint64(k.end-k.start) + 3
	return s.jsonText()
}

// jsonText counts every byte of a value as a character.
func (s *scanner[T]) jsonText() error {
	start := s.i
	err := s.skip(true)
	s.body.ToolChars += uint64(s.i - start)
	return err
}

// toolCalls counts the calls of a chat message: tool_calls, a list of
// {function: {name, arguments}}, or function_call, one {name, arguments}.
func (s *scanner[T]) toolCalls() error {
	if s.data[s.i] != '[' {
		return s.toolCall()
	}
	return s.inArray(s.toolCall)
}

func (s *scanner[T]) toolCall() error {
	if s.data[s.i] != '{' {
		return s.skip(true)
	}
	return s.inObject(s.toolCallMember)
}

func (s *scanner[T]) toolCallMember(k token) error {
	name, err := s.field(k, toolCallKeys)
	switch {
	case err != nil:
		return err
	case name == "function" && s.data[s.i] == '{':
		return s.inObject(s.callMember)
	}
	return s.callField(name)
}

// callMember counts a call's name and arguments, what the model wrote.
func (s *scanner[T]) callMember(k token) error {
	name, err := s.field(k, callKeys)
	if err != nil {
		return err
	}
	return s.callField(name)
}

// callField reads a call's member that field named ("" for none).
func (s *scanner[T]) callField(name string) error {
	if name == "name" || name == "arguments" {
		return s.toolText()
	}
	return s.skip(true)
}

// toolText counts a string value's characters as a tool's, and skips any
// other value.
func (s *scanner[T]) toolText() error {
	if s.data[s.i] != '"' {
		return s.skip(true)
	}
	return s.charsTo(&s.body.ToolChars)
}
