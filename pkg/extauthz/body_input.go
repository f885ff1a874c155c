package extauthz

// Responses API and embeddings inputs, instructions, and completions
// prompts: text, items, and token IDs.

// input counts a Responses or embeddings input: a string, a list of
// strings, token IDs (a list, or a list of lists), or items.
func (s *scanner[T]) input() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.inputItem)
	}
	return s.skip(false)
}

func (s *scanner[T]) inputItem() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.tokenID)
	case '{':
		return s.imageObject(s.itemMember)
	}
	return s.tokenID()
}

// itemMember reads a member of a Responses input item: a message's
// content, a function call's name and arguments or its output, a
// reasoning summary; or, for an item that is itself a part, what
// partMember reads.
func (s *scanner[T]) itemMember(k token) error {
	name, err := s.field(k, itemKeys)
	switch {
	case err != nil:
		return err
	case name == "content", name == "output", name == "summary":
		return s.content()
	case name == "arguments", name == "name":
		return s.toolText()
	}
	return s.partField(name)
}

// textOrItems counts a string, or a list of input items (instructions
// may be either).
func (s *scanner[T]) textOrItems() error { return s.textOrList(s.inputItem) }

// prompt counts a completions prompt: a string, a list of strings, a list
// of token IDs, or a list of lists of token IDs.
func (s *scanner[T]) prompt() error { return s.textOrList(s.promptItem) }

// textOrList counts a string, or each element of a list with each; any
// other value is skipped.
func (s *scanner[T]) textOrList(each func() error) error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(each)
	}
	return s.skip(false)
}

func (s *scanner[T]) promptItem() error {
	switch s.data[s.i] {
	case '"':
		return s.chars()
	case '[':
		return s.array(s.tokenID)
	}
	return s.tokenID()
}

// tokenID counts a number and skips any other value.
func (s *scanner[T]) tokenID() error {
	if c := s.data[s.i]; c == '{' || c == '[' {
		return s.skip(false)
	}
	t, err := s.scalar()
	if err == nil && t.kind == tokenNumber {
		s.body.PromptTokens++
	}
	return err
}
